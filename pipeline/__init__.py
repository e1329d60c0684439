"""PARS: learned shortest-job-first scheduling for LLM serving, as a DVC pipeline.

Data flows one way: prompts -> generations -> pairs -> models -> metrics/export -> serving.
Stage modules live at the top of the package (one per DVC stage); reusable parts live in
the subpackages `sources`, `backends`, `ranking`, `serving` and `queueing`.
"""

__version__ = "0.1.0"
