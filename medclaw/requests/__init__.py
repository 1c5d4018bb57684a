"""The VLM/LLM request layout shared by the engine and the tools: the append-only conversation,
the media identity (prefix-cache uuid) and the parsing of a model's raw output."""
