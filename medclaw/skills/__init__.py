"""Skills: the SKILL.md library the orchestrator lists and loads (see `library`)."""
