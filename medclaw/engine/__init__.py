"""Engine: generation backends, prompt layout, episode loop, budgets and traces."""
