"""Length-ranking predictors: the plain model, the losses, and (separately) Lightning training."""
