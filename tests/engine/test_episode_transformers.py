"""The same `medclaw ask` episode on the transformers backend, switched by the config file alone.

A user config whose `models:` section moves the tiny-cpu profile's generation roles to
`backend: transformers` must (1) resolve to the very same tiny checkpoints with only the backend
changed (and none of the profile's vLLM engine defaults leaking into the transformers spec), and
(2) run the unchanged `medclaw ask` path end to end: no vLLM engine starts, the roles are served
by `TransformersBackend`, and the trace names those models with their store revisions.
"""
from __future__ import annotations

import json

import pytest

QUESTION = "Which instrument was brought in just before the vessel was cut?"
SWITCHED = {"orchestrator": "tiny-llm", "video_expert": "tiny-vlm",
            "frame_verifier": "tiny-vlm", "judge": "tiny-llm"}
MAX_STEPS = 3


def _write_config(folder) -> str:
    """The user-facing YAML: the tiny-cpu profile, with each generation role moved to transformers."""
    lines = ["profile: tiny-cpu", "models:"]
    lines += [f"  {role}: {{preset: {preset}, backend: transformers}}" for role, preset in SWITCHED.items()]
    path = folder / "medclaw-transformers.yaml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _tiny_path(tiny_models, preset: str) -> str:
    return str(tiny_models.llm if preset == "tiny-llm" else tiny_models.vlm)


# --- the config alone flips the backend --------------------------------------------------------

def test_config_flips_only_the_backend(tiny_models, tmp_path):
    from medclaw.models.registry import load_models

    default = load_models(profile="tiny-cpu")
    switched = load_models(config_path=_write_config(tmp_path))
    assert switched["encoder"] == default["encoder"]
    for role, preset in SWITCHED.items():
        before, after = default[role], switched[role]
        assert before.backend == "vllm" and after.backend == "transformers"
        assert after.path == before.path == _tiny_path(tiny_models, preset)
        assert (after.name, after.architecture, after.max_model_len, after.max_pixels, after.fps) == \
            (before.name, before.architecture, before.max_model_len, before.max_pixels, before.fps)
        # the profile's `defaults.vllm` (CPU engine arguments) belong to vLLM only: passed to
        # transformers' from_pretrained they would be unknown keyword arguments
        assert "enforce_eager" in before.extra and "enforce_eager" not in after.extra


# --- constrained decoding on the transformers backend -------------------------------------------

def _outside_strings(text: str) -> str:
    """The characters of a JSON text that are not inside a string literal."""
    out, in_string, escaped = [], False, False
    for c in text:
        if in_string:
            in_string = escaped or c != '"'
            escaped = not escaped and c == "\\"
        elif c == '"':
            in_string = True
        else:
            out.append(c)
    return "".join(out)


@pytest.mark.slow
async def test_transformers_backend_enforces_json_schema(tiny_models):
    pytest.importorskip("xgrammar")
    from medclaw.engine.backends.hf import TransformersBackend
    from medclaw.requests.conversation import Conversation
    from medclaw.models.spec import ModelSpec

    schema = {"type": "object", "additionalProperties": False, "required": ["tool", "args"],
              "properties": {"tool": {"type": "string", "enum": ["zoom", "final_answer"]},
                             "args": {"type": "object", "additionalProperties": False,
                                      "required": ["text", "ok"],
                                      "properties": {"text": {"type": "string", "maxLength": 8},
                                                     "ok": {"type": "boolean"}}}}}
    backend = TransformersBackend(ModelSpec(name="tiny-llm", path=str(tiny_models.llm)))
    try:
        assert backend.supports_json_schema
        requests = [Conversation("SYS").add_user("Act.").to_request(
            max_tokens=120, json_schema=schema, temperature=temperature, seed=seed)
            for temperature, seed in ((0.0, None), (1.0, 1), (1.0, 2))]
        free = Conversation("SYS").add_user("Act.").to_request(max_tokens=40)
        *constrained, unconstrained = await backend.generate([*requests, free])
    finally:
        backend.shutdown()
    for result in constrained:
        # random weights, valid JSON (xgrammar lets a raw control character into a string)
        value = json.loads(result.text, strict=False)
        assert list(value) == ["tool", "args"] and value["tool"] in ("zoom", "final_answer")
        assert len(value["args"]["text"]) <= 8 and isinstance(value["args"]["ok"], bool)
        assert result.finish_reason == "stop"
        # compact, like vLLM's grammar: what the model learnt to write is what it may write
        assert _outside_strings(result.text).strip() == _outside_strings(result.text)
        assert not any(c.isspace() for c in _outside_strings(result.text)), result.text
    with pytest.raises(ValueError):                            # the control: garbage without it
        json.loads(unconstrained.text)


# --- the episode, end to end ---------------------------------------------------------------------

@pytest.mark.engine
@pytest.mark.slow
def test_ask_runs_on_transformers_by_config_alone(tiny_models, synth_video, tmp_path, monkeypatch,
                                                  capsys):
    import medclaw.engine.backends as backends_module
    import medclaw.engine.runtime as runtime_module
    from medclaw import cli
    from medclaw.engine.backends.hf import TransformersBackend
    from medclaw.engine.trace import TRACE_FORMAT, Trace
    from medclaw.kernels.probe import probe_video
    from medclaw.models.store import revision_hash

    # Only `ask` registered: the test is about this command, not about importing the others.
    monkeypatch.setattr(cli, "COMMANDS", {"ask": cli.COMMANDS["ask"]})
    built, runtimes = [], []
    real_backend_class, real_open_runtime = backends_module.backend_class, runtime_module.open_runtime

    def guarded_backend_class(kind):                  # Runtime._construct looks it up per call
        built.append(kind)
        if kind == "vllm":
            raise AssertionError("a vLLM engine was started although the config says transformers")
        return real_backend_class(kind)

    def spying_open_runtime(**kwargs):
        runtimes.append(real_open_runtime(**kwargs))
        return runtimes[-1]

    monkeypatch.setattr(backends_module, "backend_class", guarded_backend_class)
    monkeypatch.setattr(runtime_module, "open_runtime", spying_open_runtime)

    config = _write_config(tmp_path)
    rc = cli.main(["ask", str(synth_video.path), QUESTION, "--config", config, "--json",
                   "--max-steps", str(MAX_STEPS), "--trace-dir", str(tmp_path / "traces")])
    out = json.loads(capsys.readouterr().out)
    assert out["status"] in ("answered", "forced_answer"), out["status"]
    assert rc == 0 and out["answer"]

    # engines: one transformers model per distinct checkpoint (shared by its two roles), no vLLM
    assert built and set(built) == {"transformers"} and len(built) <= 2
    (runtime,) = runtimes
    live = runtime.live_backends()
    assert "orchestrator" in live
    assert all(isinstance(backend, TransformersBackend) for backend in live.values())

    # the trace: header / steps / footer, naming the transformers models and their revisions
    revisions = {preset: revision_hash(_tiny_path(tiny_models, preset)) for preset in set(SWITCHED.values())}
    trace = Trace.load(out["trace"])
    assert trace.header["format"] == TRACE_FORMAT
    assert trace.header["video"]["sha256"] == probe_video(synth_video.path).sha256
    assert trace.header["config"]["max_steps"] == MAX_STEPS
    for role, preset in SWITCHED.items():
        model = trace.header["models"][role]
        assert model["backend"] == "transformers" and model["name"] == preset
        assert model["path"] == _tiny_path(tiny_models, preset)
        assert model["revision"] == revisions[preset]
    assert 1 <= len(trace.steps) <= MAX_STEPS + 1 and out["steps"] == len(trace.steps)
    assert [step["index"] for step in trace.steps] == list(range(1, len(trace.steps) + 1))
    for step in trace.steps:
        call = step["orchestrator_call"]
        assert (call["model_name"], call["model_revision"]) == ("tiny-llm", revisions["tiny-llm"])
        assert call["num_prompt_tokens"] > 0 and call["num_cached_tokens"] == 0   # no prefix cache
        for sub in step["model_calls"]:                       # video expert / frame verifier calls
            assert (sub["model_name"], sub["model_revision"]) == ("tiny-vlm", revisions["tiny-vlm"])
    assert trace.footer is not None and trace.footer["status"] == out["status"]
    assert trace.footer["answer"] == out["answer"]
    assert trace.footer["totals"]["steps"] == len(trace.steps)
    assert set(trace.footer["totals"]["model_revisions"]) <= {
        f"{preset}@{revision}" for preset, revision in revisions.items()}
