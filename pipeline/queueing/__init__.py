"""Queueing theory of KV-bound LLM serving (document 003) and the serving simulator."""
