"""Which speculative decoding a server gets, decided from the model's own ``config.json``.

Pure functions, no I/O: the caller reads ``<model>/config.json`` (when the model is a local
directory) and passes the parsed object in. The rules, for the pinned SGLang release
(:mod:`workers.node.sglang_release`):

* a draft model given on the node (``--draft-model PATH``): EAGLE3 with that draft, 3/1/4;
* an architecture SGLang rewrites into its own MTP draft (:data:`MTP_ARCHITECTURES`) whose
  config declares MTP layers: NEXTN 3/1/4, the draft being the target's own MTP head;
* anything else (a dense model, an MTP-capable architecture without MTP layers, a hub id with
  no local config): no speculation. NEXTN on a model without MTP layers would load the whole
  target a second time as its "draft", or an uninitialised MTP head.

A ``--speculative-algorithm`` in the user's own SGLang flags turns the profile off: the user's
speculation is used as given. Every other flag the user passes replaces ours (see
:func:`workers.node.launch.merge_flags`). SGLang 0.5.23 keeps the radix (prefix) cache on with
speculative decoding by itself, so no profile adds a flag for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dflash_tasks.core.errors import ConfigError
from workers.node.sglang_release import SGLANG_VERSION

#: ``architectures[0]`` values that SGLang's ``ModelConfig._config_draft_model`` turns into an
#: MTP/NextN draft of the target itself (sglang/srt/configs/model_config.py of the pinned
#: release; tests/deploy/test_sglang_release.py reads that file and checks this set).
MTP_ARCHITECTURES: frozenset[str] = frozenset(
    {
        "BailingMoeForCausalLM",
        "BailingMoeV2ForCausalLM",
        "BailingMoeV2_5ForCausalLM",
        "BailingMoeV3ForCausalLM",
        "DeepseekV32ForCausalLM",
        "DeepseekV3ForCausalLM",
        "DeepseekV4ForCausalLM",
        "Ernie4_5_MoeForCausalLM",
        "ExaoneMoEForCausalLM",
        "ExaoneMoeForCausalLM",
        "GigaChat35ForCausalLM",
        "Glm4MoeForCausalLM",
        "Glm4MoeLiteForCausalLM",
        "Glm5NextForConditionalGeneration",
        "GlmMoeDsaForCausalLM",
        "GlmOcrForConditionalGeneration",
        "HYV3ForCausalLM",
        "HYV4ForCausalLM",
        "InklingForConditionalGeneration",
        "InternS2MobiusForConditionalGeneration",
        "InternS2PreviewForConditionalGeneration",
        "LongcatFlashForCausalLM",
        "MiMoForCausalLM",
        "MiMoV2FlashForCausalLM",
        "MiMoV2ForCausalLM",
        "NemotronHForCausalLM",
        "NemotronHPuzzleForCausalLM",
        "NemotronH_Omni_Reasoning_V3",
        "Qwen3MoeForCausalLM",
        "Qwen3NextForCausalLM",
        "Qwen3_5ForCausalLM",
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForCausalLM",
        "Qwen3_5MoeForConditionalGeneration",
        "Qwen4ExpForConditionalGeneration",
        "Step3p5ForCausalLM",
        "Step3p7ForConditionalGeneration",
    }
)

#: config.json keys that count MTP layers: DeepSeek/GLM/MiMo style, and Qwen3-Next/3.5 style.
MTP_LAYER_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")

#: One SGLang flag and its values: ``("--speculative-num-steps", ("3",))``.
FlagPair = tuple[str, tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class SpecDecode:
    """Speculative decoding flags. With top-k 1, SGLang forces draft tokens = steps + 1."""

    algorithm: str
    num_steps: int = 3
    eagle_topk: int = 1
    num_draft_tokens: int = 4
    draft_model_path: str = ""

    def flag_pairs(self) -> tuple[FlagPair, ...]:
        pairs: list[FlagPair] = [("--speculative-algorithm", (self.algorithm,))]
        if self.draft_model_path:
            pairs.append(("--speculative-draft-model-path", (self.draft_model_path,)))
        pairs += [
            ("--speculative-num-steps", (str(self.num_steps),)),
            ("--speculative-eagle-topk", (str(self.eagle_topk),)),
            ("--speculative-num-draft-tokens", (str(self.num_draft_tokens),)),
        ]
        return tuple(pairs)


#: MTP with the target's own MTP layers (NEXTN is SGLang's alias of EAGLE for them).
NEXTN = SpecDecode("NEXTN")


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What ``config.json`` says that matters here."""

    architecture: str
    mtp_layers: int
    #: Where the layer count was found, e.g. ``text_config.mtp_num_hidden_layers``; "" if none.
    mtp_key: str = ""


@dataclass(frozen=True, slots=True)
class Profile:
    """The speculative decoding of every server of a node, and why."""

    name: str
    reason: str
    #: The SGLang flags of this profile, each with its values.
    flags: tuple[FlagPair, ...] = ()

    def describe(self) -> str:
        return f"profile {self.name}: {self.reason}"


def _layer_count(value: object, where: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{where}: expected a layer count (an integer >= 0), got {value!r}")
    return value


def model_info(config: Mapping[str, Any], where: str = "config.json") -> ModelInfo:
    """``architectures[0]`` and the MTP layer count, at the top level or in ``text_config``
    (Qwen3.5/3.6 and other multimodal wrappers keep the language model's settings there)."""
    if not isinstance(config, Mapping):
        raise ConfigError(f"{where}: expected a JSON object, got {type(config).__name__}")
    archs = config.get("architectures")
    if archs is None:
        archs = []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise ConfigError(f"{where}: 'architectures' must be a list of names, got {archs!r}")
    scopes: list[tuple[str, Mapping[str, Any]]] = [("", config)]
    text = config.get("text_config")
    if isinstance(text, Mapping):
        scopes.append(("text_config.", text))
    layers, found = 0, ""
    for prefix, scope in scopes:
        for key in MTP_LAYER_KEYS:
            count = _layer_count(scope.get(key), f"{where}: {prefix}{key}")
            if count > layers:
                layers, found = count, f"{prefix}{key}"
    return ModelInfo(archs[0] if archs else "", layers, found)


def _user_sets(flag: str, user_args: Sequence[str]) -> str | None:
    """The value the user's args give ``flag`` (the last one, as argparse keeps), else None."""
    value: str | None = None
    for i, arg in enumerate(user_args):
        if arg == flag:
            value = user_args[i + 1] if i + 1 < len(user_args) else ""
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1 :]
    return value


def choose_profile(
    model_path: str,
    config: Mapping[str, Any] | None,
    draft_model: str = "",
    user_args: Sequence[str] = (),
) -> Profile:
    """The profile for ``model_path``; ``config`` is its parsed ``config.json`` or None when
    there is no local one (a hub id, or a path that is not a directory on this machine)."""
    user_algo = _user_sets("--speculative-algorithm", user_args)
    if user_algo is not None:
        return Profile(
            "user",
            f"your SGLang flags set --speculative-algorithm {user_algo}: speculative decoding as you "
            "give it" + (f", with the draft model {draft_model}" if draft_model else ""),
            (("--speculative-draft-model-path", (draft_model,)),) if draft_model else (),
        )
    if draft_model:
        return Profile(
            "eagle3",
            f"draft model {draft_model} given: EAGLE3 3/1/4 with --speculative-draft-model-path",
            SpecDecode("EAGLE3", draft_model_path=draft_model).flag_pairs(),
        )
    if config is None:
        where = (
            f"{model_path} is not a directory on this machine"
            if model_path.startswith(("/", ".", "~"))
            else f"{model_path} looks like a hub id, which SGLang downloads itself"
        )
        return Profile(
            "none",
            f"no local config.json ({where}): no speculation is guessed, only your own SGLang flags "
            "apply. Stage the model in a local directory, or pass --draft-model PATH or "
            "--sglang-arg '--speculative-algorithm ...'",
        )
    info = model_info(config, f"{model_path}/config.json")
    arch = info.architecture or "(no architectures)"
    if info.architecture in MTP_ARCHITECTURES and info.mtp_layers > 0:
        return Profile(
            "mtp",
            f"{arch} with MTP layers ({info.mtp_key}={info.mtp_layers}): NEXTN 3/1/4 on the model's "
            "own MTP head",
            NEXTN.flag_pairs(),
        )
    if info.architecture in MTP_ARCHITECTURES:
        why = f"{arch} can carry an MTP head, but config.json declares no MTP layers"
    else:
        why = f"{arch} has no MTP head in SGLang {SGLANG_VERSION}"
    return Profile("none", f"{why}: no speculation (--draft-model PATH enables EAGLE3)")
