"""The budgets of one episode: orchestrator steps, visual tokens, wall-clock time — and the
orchestrator's context window, which must still hold the next turn.

`max_steps` counts every orchestrator call, the answer included: the steps budget is spent after
`max_steps - 1` calls, so that a forced answer is call `max_steps` at the latest and the step
counter never passes its limit. The wall clock starts when the budget is made, i.e. after the
engines are up (`Runtime.start`): it times the episode, not engine start-up.

`Budget` only measures; the episode loop decides. Visual tokens are charged by the tools on the
`ToolContext` (`visual_tokens_used`), so the budget reads them from there instead of keeping a
second count that could drift. The context estimate (`context_tokens`) is set by the loop after
each turn (prompt + completion + the coming observation); when it plus the reply's token
allowance would not fit `max_context_tokens` (the orchestrator's max_model_len), the episode must
answer now rather than fail on an over-long prompt. `exhausted()` names the first budget that is spent (or None);
`warning()` returns one line for the model once any budget crosses `warn_at`, so the orchestrator
can wrap up on its own before the loop forces an answer.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from medclaw.engine.config import EpisodeConfig


# Room kept beyond a full reply: the forced-answer turn and chat-template tokens around it, so that
# the forced call still fits when the context check fires.
CONTEXT_MARGIN_TOKENS = 256


@dataclass(slots=True)
class Budget:
    config: EpisodeConfig
    ctx: object = None                     # ToolContext: visual_tokens_used / visual_token_budget
    steps_used: int = 0
    started_at: float = 0.0                # set from `clock` on construction
    clock: object = time.monotonic         # injectable for tests
    max_context_tokens: int = 0            # orchestrator's max_model_len; 0 = unchecked
    context_tokens: int = 0                # estimated prompt size of the next orchestrator call
    reply_tokens: int = 0                  # tokens a reply may take (orchestrator_max_tokens)

    def __post_init__(self) -> None:
        self.started_at = self.clock()

    # --- measurements -------------------------------------------------------------------------
    @property
    def elapsed_s(self) -> float:
        return self.clock() - self.started_at

    @property
    def visual_tokens_used(self) -> int:
        return int(getattr(self.ctx, "visual_tokens_used", 0) or 0)

    @property
    def steps_left(self) -> int:
        """Orchestrator calls left, the one kept for the answer included."""
        return max(0, self.config.max_steps - self.steps_used)

    def fractions(self) -> dict[str, float]:
        """Fraction of each budget spent, 0..1+."""
        gathering_steps = self.config.max_steps - 1          # the last call is for the answer
        return {
            "steps": self.steps_used / gathering_steps if gathering_steps > 0 else 1.0,
            "visual_tokens": self.visual_tokens_used / self.config.visual_token_budget,
            "wall_time": self.elapsed_s / self.config.max_wall_s,
        }

    # --- decisions ----------------------------------------------------------------------------
    def exhausted(self) -> str | None:
        """The first spent budget as a short phrase, or None while all have room."""
        for name, fraction in self.fractions().items():
            if fraction >= 1.0:
                return f"{name.replace('_', ' ')} budget spent"
        if self.max_context_tokens and self.context_tokens + self.reply_tokens \
                + CONTEXT_MARGIN_TOKENS > self.max_context_tokens:
            return "context window nearly full"
        return None

    def warning(self) -> str | None:
        """One line for the model once any budget has crossed `warn_at` (None before that).

        The time spent is named only once the wall-time budget itself has crossed `warn_at`:
        clock readings in the prompt would make two runs of the same inputs differ."""
        fr = self.fractions()
        if max(fr.values()) < self.config.warn_at:
            return None
        time_part = (f"; time {self.elapsed_s:.0f}/{self.config.max_wall_s:.0f} s"
                     if fr["wall_time"] >= self.config.warn_at else "")
        return (f"BUDGET WARNING: {self.steps_left} step(s) left of {self.config.max_steps}, "
                "the last one for final_answer; "
                f"visual tokens {self.visual_tokens_used}/{self.config.visual_token_budget}"
                f"{time_part}. Gather only what you still need, then call final_answer.")

    def to_dict(self) -> dict:
        return {"steps_used": self.steps_used, "max_steps": self.config.max_steps,
                "visual_tokens_used": self.visual_tokens_used,
                "visual_token_budget": self.config.visual_token_budget,
                "elapsed_s": round(self.elapsed_s, 3), "max_wall_s": self.config.max_wall_s,
                "context_tokens": self.context_tokens, "max_context_tokens": self.max_context_tokens}
