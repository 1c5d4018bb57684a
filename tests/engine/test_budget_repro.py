"""The budget warning the orchestrator reads holds no clock reading unless time is what runs out:
two runs of the same inputs must send the same prompts (reproducible traces)."""
from medclaw.engine.budget import Budget
from medclaw.engine.config import EpisodeConfig


def test_warning_text_does_not_depend_on_the_clock_until_time_runs_short():
    config = EpisodeConfig(max_steps=5, max_wall_s=100.0, warn_at=0.75)
    warnings = []
    for elapsed in (3.2, 41.7):                       # the same steps, different wall times
        now = [0.0]
        budget = Budget(config=config, clock=lambda: now[0])
        budget.steps_used, now[0] = 3, elapsed
        warnings.append(budget.warning())
    assert warnings[0] == warnings[1] and "time" not in warnings[0]
    now = [0.0]
    late = Budget(config=config, clock=lambda: now[0])
    now[0] = 80.0
    assert "time 80/100 s" in late.warning()
