"""Models: specs, the preset registry (config file), local model store and the tiny-checkpoint builder."""
