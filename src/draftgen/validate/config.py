"""validate.ipynb's parameters as one frozen, validated config; and the flags it can raise."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from draftgen.params import (
    EnableThinking,
    NotebookCell,
    Params,
    PositiveInt,
    ProjectPath,
    TrainerName,
    TrainMaxLength,
    _unset_if_empty,
    param,
)
from draftgen.training.masks import MaskSpec
from draftgen.training.trainers import DEFAULT_TRAINER, LEGACY_CONVENTIONS, Trainer

# Every flag a sample can carry, with what it means (shown in the notebook's flag table).
FLAGS: dict[str, str] = {
    "empty_answer": "content is missing or only whitespace",
    "empty_reasoning": "reasoning_content is missing or only whitespace (thinking on)",
    "unclosed_think": "cut inside thinking: no answer after reasoning that hit the length limit, "
    "or a <think> without </think> in the answer",
    "truncated": "finish_reason is not 'stop' (length limit hit, aborted, or missing); a turn cut by max_tokens "
    "whose row holds the server's ids trains as generated (train_truncated), in prompts.jsonl, not train.jsonl",
    "repetition_loop": "generate's loop check ended the turn in a repetition loop: stored up to the end of its "
    "cycle's first repetition, without ids; dropped unless train_loops",
    "tiny_mask": "loss mask covers <= min_assistant_tokens tokens",
    "over_max_length": "the rendered conversation is longer than max_length tokens",
    "think_markers_in_answer": "<think> or </think> inside the answer (reasoning not separated)",
    "duplicate_answer": "the exact same answer for >= duplicate_answer_min_prompts prompts",
    "template_mismatch": "the trainer does not see the sample as generated: the prompt's tokens are not a prefix "
    "of the full conversation's, the conversation is cut, no assistant span or end-of-turn (reason in mismatch)",
    "invalid_text": "U+FFFD replacement characters, NULs, non-characters or escaped lone surrogates",
    "duplicate_id": "an id already seen in an earlier row (the export keeps the first)",
    "foreign_assistant_turn": "an assistant turn in the history the target model did not write (turns: last); "
    "the trainer would supervise it",
    "retokenized_differs": "re-tokenizing the text gives other tokens than the target produced (the export uses the "
    "server's; where they first differ in difference)",
    "ids_missing": "the server sent no token ids for this turn: its row is re-tokenized from the text",
    "ids_unusable": "the server's token ids do not fit this tokenizer or this answer (reason in ids_problem): "
    "another tokenizer, ids that do not decode to the stored text, or corrupt stored ids",
    "trainer_rejects": "the trainer's loader would drop the row (DFlash: fewer than 2 supervised tokens after the "
    "max_length cut, or no two adjacent)",
    "unknown_tool": "the target called a function its conversation's tools do not offer",
    "invalid_tool_arguments": "the target's call arguments are not a JSON object (SpecForge would render {} instead)",
    "tool_divergence": "the target's calls were not the source's (other functions or arguments, a call where the "
    "source answered in text, or none where it called): the conversation ended at this turn; the turn itself is the "
    "target's own answer and trains unless dropped",
}
FlagName = Literal[
    "empty_answer",
    "empty_reasoning",
    "unclosed_think",
    "truncated",
    "repetition_loop",
    "tiny_mask",
    "over_max_length",
    "think_markers_in_answer",
    "duplicate_answer",
    "template_mismatch",
    "invalid_text",
    "duplicate_id",
    "foreign_assistant_turn",
    "retokenized_differs",
    "ids_missing",
    "ids_unusable",
    "trainer_rejects",
    "unknown_tool",
    "invalid_tool_arguments",
    "tool_divergence",
]
# What to fix when a flag drops most of the degenerate samples (the gate's advice names the cause it saw).
FLAG_ADVICE: dict[str, str] = {
    "empty_answer": "the server returned answers without content: check its --reasoning-parser and chat template, "
    "and that enable_thinking reaches it.",
    "empty_reasoning": "thinking was on but no reasoning came back: check the server's --reasoning-parser (qwen3).",
    "repetition_loop": "answers looped: check the sampling (temperature 0.6, top_p 0.95, top_k 20 for Qwen3 "
    "thinking) reaches the server, or set train_loops.",
    "tiny_mask": "the trainer supervises almost nothing of these rows: see the mismatch column and the trainer's "
    "convention.",
    "template_mismatch": "the trainer's chat template does not see the samples as generated: give validate the served "
    "model's tokenizer folder and the trainer whose convention matches its template (the mismatch column says why).",
    "ids_unusable": "the server's token ids do not fit this tokenizer or the trainer's template (the ids_problem "
    "column says which): give the served model's tokenizer folder, and a trainer whose assistant header its chat "
    "template renders.",
    "trainer_rejects": "the trainer's loader would drop these rows: see its minimum supervised tokens.",
    "duplicate_answer": "many prompts got the same answer: look at duplicate_answer's examples (a server stuck on one "
    "reply?).",
    "invalid_text": "the answers hold broken characters: check the server's detokenizer and the shards' encoding.",
    "think_markers_in_answer": "reasoning was not separated from the answer: start the server with "
    "--reasoning-parser qwen3.",
    "foreign_assistant_turn": "the histories hold answers another model wrote: generate with turns: all.",
}
FLAG_ADVICE_DEFAULT = "look at its examples above."
# Flags that mean "the length budget ran out", not "the model produced garbage": a thinking model at
# max_tokens 4096 truncates a predictable share of samples. They are dropped from the export like any flag, but
# the gate judges them against their own threshold (max_truncated_share), so expected truncation does not
# masquerade as garbage and garbage cannot hide inside the truncation budget.
LENGTH_FLAGS: tuple[str, ...] = ("truncated", "unclosed_think", "over_max_length")
# Reported, not dropped, unless the user asks: a row over max_length is cut as the trainer cuts it (its first
# max_length tokens still train), a re-tokenized difference is what the server's ids fix, a turn without ids is
# exported from its text (the card says how many), and a turn whose calls were not the source's is the target's own
# answer to a valid prompt (the conversation ended there; the card counts them).
KEPT_BY_DEFAULT: tuple[str, ...] = (
    "over_max_length",
    "retokenized_differs",
    "ids_missing",
    "tool_divergence",
)
# What a loop cut explains: no answer when the loop was in the reasoning. With train_loops it does not drop a loop.
LOOP_CONSEQUENCES: tuple[str, ...] = ("empty_answer",)
# What a cut by max_tokens explains: no answer when the cut fell inside the reasoning, a think block never closed.
# A cut turn that trains as generated (train_truncated) is not dropped for these either; any other flag still drops it.
CUT_CONSEQUENCES: tuple[str, ...] = ("truncated", "unclosed_think", "empty_answer")
Share = Annotated[float, Field(ge=0, le=1)]


class ValidateConfig(Params):
    parameters_cell = NotebookCell(
        (
            "",
            "generation_dir prompt_file tokenizer out_dir trainer mask_convention enable_thinking "
            "rows token_ids min_assistant_tokens train_max_length duplicate_answer_min_prompts max_degenerate_share "
            "max_truncated_share train_truncated train_loops keep_flagged holdout_share export_jsonl export_prompts export_tokens "
            "batch_size examples_per_flag",
        ),
        help={
            "enable_thinking": "the generation's setting: thinking on expects non-empty reasoning",
            "train_max_length": "the trainer's max_length: longer rendered samples are flagged over_max_length and "
            "cut there, as the trainer cuts them (0: no cut)",
        },
        doc={
            "train_max_length": "the trainer's max_length, the shared value generate caps each turn at: longer "
            "rendered samples are over_max_length; SpecForge trainers cut input_ids and loss_mask here, and so does "
            "the export (0: no cut)",
            "trainer": "whose loss mask to reproduce, token for token: "
            + ", ".join(t.value for t in Trainer)
            + ' ("The loss mask, exactly" below)',
        },
    )

    generation_dir: ProjectPath | list[ProjectPath] = param(
        ...,
        'generate\'s out_dir; or a list of them: the "i/n" shards of one prompt file',
        notebook="outputs/demo/generate",
    )
    prompt_file: ProjectPath = param(
        "",
        'the prompt file the folders should cover ("": the one their manifests name)',
        doc='the prompt file the folders should cover; "": the one their manifests name (give it when the file sits '
        "elsewhere on this machine)",
    )
    tokenizer: ProjectPath = param(
        ...,
        "the target model's folder (tokenizer.json + chat template), local files only",
        notebook="outputs/demo/tokenizer",
        min_length=1,
    )
    out_dir: ProjectPath = param(
        ...,
        "report tables + training export (draftgen run sets the run folder)",
        notebook="outputs/validate/interactive",
        doc="report tables and export (draftgen run sets the run folder); must not be inside generation_dir",
        min_length=1,
    )
    trainer: TrainerName
    mask_convention: Literal["think_in_prompt", "think_in_target"] | None = param(
        None,
        "former name of the draftgen trainers (think_in_prompt, think_in_target), empty means use trainer",
        doc="former name of the two draftgen-* trainers (think_in_prompt, think_in_target); still accepted",
    )
    enable_thinking: EnableThinking
    min_assistant_tokens: Annotated[int, Field(ge=0)] = param(
        16, "tiny_mask when the loss mask covers this many tokens or fewer"
    )
    train_max_length: TrainMaxLength
    duplicate_answer_min_prompts: Annotated[int, Field(ge=2)] = param(
        10, "duplicate_answer when this many prompts share one exact answer"
    )
    max_degenerate_share: Share = param(
        0.05,
        "the gate: fail when more than this share is garbage (empty, tiny, mismatched...)",
        doc="the gate: fail when a larger share of samples is garbage (dropped for a defect)",
    )
    max_truncated_share: Share = param(
        0.25,
        "the gate: fail when more than this share is cut by max_tokens (cuts at the trainer's max_length are expected)",
        doc="the gate: fail when a larger share was cut by max_tokens (dropped only for a length limit, or cut and "
        "trained as generated); a turn cut where the trainer's max_length left it less room is expected and not "
        "counted",
    )
    train_truncated: bool = param(
        True,
        "a turn cut by max_tokens trains as generated where its row holds the server's ids (nothing appended; in "
        "prompts.jsonl and the token parquet, not train.jsonl, whose chat template would close it); false: dropped",
    )
    train_loops: bool = param(
        False,
        "a turn ended as a repetition loop trains on what was stored (its text up to the loop's first repetition, "
        "rendered by the chat template, which closes it); false: dropped",
        doc="a turn generate's loop check ended (`repetition_loop`) trains on what was stored — its text up to the "
        "end of the cycle's first repetition, re-tokenized and rendered by the chat template, which closes the "
        'think block and the turn after it; false: such rows are dropped ("Repetition loops" below)',
    )
    keep_flagged: list[FlagName] = param(
        default_factory=lambda: list(KEPT_BY_DEFAULT),
        help="flags to report but not drop (a row over max_length is then cut as the trainer cuts it)",
    )
    rows: Literal["per_turn", "per_conversation"] = param(
        "per_turn",
        "per_turn: one training row per generated turn, its history as the target saw it, that turn supervised; "
        "per_conversation: one row per conversation, every assistant turn as the template renders it",
    )
    token_ids: Literal["server", "retokenize"] = param(
        "server",
        "server: rows from the target's own token ids where the server sent them; retokenize: from the text",
    )
    holdout_share: Share = param(
        0.01,
        "share of prompt ids held out of the training export (stable id hash; whole conversations), written to "
        "export/holdout/ for the drafter verdict (0: none)",
    )
    export_prompts: bool = param(
        True,
        "write SpecForge's pre-tokenized data.prompts_path JSONL {id, input_ids, loss_mask} (DFlash reads it)",
    )
    export_jsonl: bool = param(True, 'write clean samples as JSONL {"id", "conversations"}')
    export_tokens: bool = param(False, "also write parquet with input_ids and loss_mask per clean sample")
    batch_size: PositiveInt = param(1024, "samples rendered and tokenized per batch (memory vs. speed)")
    examples_per_flag: Annotated[int, Field(ge=0)] = param(3, "example rows shown per flag")

    @field_validator("keep_flagged")
    @classmethod
    def _no_repeats(cls, flags: list[str]) -> list[str]:
        repeated = sorted({f for f in flags if flags.count(f) > 1})
        if repeated:
            raise ValueError(f"listed more than once: {', '.join(repeated)}")
        return flags

    @field_validator("generation_dir")
    @classmethod
    def _folders(cls, value: str | list[str]) -> str | list[str]:
        folders = [value] if isinstance(value, str) else value
        if not folders:
            raise ValueError("give at least one generation folder")
        if any(not folder.strip() for folder in folders):
            raise ValueError("a generation folder is an empty string")
        resolved = [Path(folder).resolve() for folder in folders]
        repeated = sorted({folders[i] for i, p in enumerate(resolved) if resolved.count(p) > 1})
        if repeated:
            raise ValueError(f"listed more than once: {', '.join(repeated)}")
        return value

    _convention_unset = field_validator("mask_convention", mode="before")(_unset_if_empty)

    @model_validator(mode="after")
    def _legacy_convention(self) -> ValidateConfig:
        """mask_convention (the former parameter) still works: it names a generated-turn trainer.

        The notebook always passes trainer (its default when not chosen), so only another trainer conflicts.
        """
        if self.mask_convention is None:
            return self
        mapped = LEGACY_CONVENTIONS[self.mask_convention]
        if self.trainer not in (mapped, DEFAULT_TRAINER):
            raise ValueError(
                f"mask_convention {self.mask_convention} means trainer {mapped.value}, but trainer is "
                f"{self.trainer.value}: give only trainer"
            )
        object.__setattr__(self, "trainer", mapped)
        return self

    @model_validator(mode="after")
    def _separate_folders(self) -> ValidateConfig:
        target = Path(self.out_dir).resolve()
        for folder in self.generation_dirs:
            source = Path(folder).resolve()
            if target == source or source in target.parents:
                raise ValueError(
                    f"out_dir {self.out_dir} is inside generation_dir {folder}: "
                    "write the validation report and export to a folder of their own"
                )
        return self

    @property
    def generation_dirs(self) -> tuple[str, ...]:
        """The generation folders, in the order given (one for a plain string)."""
        return (self.generation_dir,) if isinstance(self.generation_dir, str) else tuple(self.generation_dir)

    @property
    def drop_flags(self) -> tuple[str, ...]:
        """Flags that keep a sample out of the export (every flag not listed in keep_flagged; repetition_loop not
        with train_loops)."""
        kept = {*self.keep_flagged, *(("repetition_loop",) if self.train_loops else ())}
        return tuple(f for f in FLAGS if f not in kept)

    @property
    def trains_cut_turns(self) -> bool:
        """Cut turns from the server's ids train as generated: asked for, dropped otherwise (``truncated`` not kept
        in every file by keep_flagged), and written to a file that holds ids (prompts.jsonl or the token parquet)."""
        return (
            self.train_truncated
            and "truncated" in self.drop_flags
            and (self.export_prompts or self.export_tokens)
        )

    @property
    def max_length(self) -> int | None:
        """The trainer's max_length (None: train_max_length 0, no cut)."""
        return self.train_max_length or None

    def mask_spec(self) -> MaskSpec:
        return MaskSpec(
            trainer=self.trainer,
            enable_thinking=self.enable_thinking,
            max_length=self.max_length,
            last_turn_only=self.rows == "per_turn",
        )
