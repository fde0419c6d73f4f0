"""When rounds leave a role's verbatim history: the fold schedules, `rounds` and `pressure`.

A fold rewrites the prompt from the summary on, so a server's prefix cache keeps only what comes
before it. How often that happens is the schedule's choice:

- rounds (TaskWeaver's rule, the default): fold the oldest rounds as soon as
  `rounds_to_compress + rounds_to_retain` are unfolded, keeping the latest `rounds_to_retain`;
  unfolded rounds past the fold trigger fold early. At (1, 1) the summary changes every round.
- pressure: append rounds untouched until the unfolded rounds pass the fold trigger, then fold
  all but the latest `rounds_to_retain` in one step (and the oldest of those too while they take
  over half the trigger, so the next fold is several rounds away). Between folds every prompt
  extends the one before it, so a local server or a cached API recomputes only the new round.

The trigger (`round_compressor.fold_token_trigger`) is a share of the role's prompt budget (0-1;
a number above 1 is read as tokens, the old form). The same schedule decides which rounds
observation masking shortens (no model call) and which summary_buffer folds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from taskweaver_lite.config.settings import FoldSchedule, RoundCompressorConfig
from taskweaver_lite.llm.tokens import Tokenizer
from taskweaver_lite.records.conversation import RoundMessages

# The rounds schedule folds early at most at half the budget, so the retained rounds always leave
# room for the current one.
ROUNDS_TRIGGER_CAP = 0.5


@dataclass(frozen=True)
class Schedule:
    """One role's fold schedule: which unfolded rounds fold now."""

    kind: FoldSchedule
    keep: int  # rounds kept verbatim after a fold
    compress: int  # rounds folded per step (rounds schedule)
    trigger: int  # tokens of unfolded rounds that make a fold due (0: off)

    @classmethod
    def for_role(cls, kind: FoldSchedule, *, settings: RoundCompressorConfig, budget: int, keep: int, buffer: bool = False) -> Schedule:
        """The schedule for a role with `budget` prompt tokens; `buffer`: summary_buffer's rule (fold past `keep`)."""
        share = settings.fold_token_trigger
        trigger = int(share) if share > 1 else int(budget * share)
        if kind == "rounds":
            trigger = min(trigger, int(budget * ROUNDS_TRIGGER_CAP))
        return cls(kind=kind, keep=keep, compress=1 if buffer else settings.rounds_to_compress, trigger=trigger)

    def due(self, unfolded: Sequence[RoundMessages], tokenizer: Tokenizer) -> tuple[RoundMessages, ...]:
        """The rounds to fold now, oldest first; empty when no fold is due. `unfolded`: rounds with messages."""
        sizes = [tokenizer.count_messages(r.messages) for r in unfolded] if self.trigger else []
        if self.kind == "pressure":
            if not self.trigger or sum(sizes) <= self.trigger:
                return ()
            fold_upto = max(len(unfolded) - self.keep, 0)
            kept_tokens = sum(sizes[fold_upto:])
            # Retained rounds over half the trigger would bring the next fold at once: fold the oldest of
            # them too (never the newest), so that several rounds pass before the prompt changes again.
            while kept_tokens > self.trigger // 2 and fold_upto < len(unfolded) - 1:
                kept_tokens -= sizes[fold_upto]
                fold_upto += 1
            return tuple(unfolded[:fold_upto])
        count_due = len(unfolded) >= self.compress + self.keep
        fold_upto = max(len(unfolded) - self.keep, 0)
        if self.trigger:
            kept_tokens = sum(sizes[fold_upto:])
            # Large rounds fold early: move the oldest kept rounds into the fold until the rest is
            # under the trigger, but keep the newest round verbatim.
            while kept_tokens > self.trigger and fold_upto < len(unfolded) - 1:
                kept_tokens -= sizes[fold_upto]
                fold_upto += 1
            if sum(sizes) > self.trigger and fold_upto > 0:
                count_due = True
        return tuple(unfolded[:fold_upto]) if count_due else ()
