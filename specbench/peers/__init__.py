"""Peer engines: other inference engines run on the same model, prompts and settings as ours (llama.cpp)."""
