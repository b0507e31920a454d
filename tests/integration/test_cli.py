"""`infer generate` as a user runs it: help text, streamed answer, clear errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from infer.cli import build_parser

FLAGS = ["--model", "--chat", "--system", "--max-tokens", "--temperature", "--top-p", "--top-k", "--min-p",
         "--repetition-penalty", "--stop", "--seed", "--ignore-eos", "--json-schema", "--regex", "--dtype", "--device",
         "--max-seq-len", "--quantization", "--speculative-method", "--num-speculative-tokens", "--draft-model",
         "--tensor-parallel-size", "--enable-expert-parallel"]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "infer.cli", *args], capture_output=True, text=True, timeout=300)


SERVE_FLAGS = ["--model", "--host", "--port", "--served-model-name", "--batching-mode", "--scheduler-policy",
               "--fairness-steps", "--max-batch-size", "--max-num-batched-tokens", "--kv-cache-backend",
               "--block-size", "--num-kv-blocks", "--kv-cache-memory-gb", "--max-waiting-requests", "--max-seq-len",
               "--quantization",
               "--speculative-method", "--num-speculative-tokens", "--prompt-lookup-min", "--prompt-lookup-max",
               "--draft-model", "--speculative-disable-by-batch-size", "--structured-compile-timeout-s",
               "--max-request-body-mb", "--header-timeout-s", "--body-timeout-s", "--keep-alive-timeout-s",
               "--shutdown-timeout-s", "--api-key", "--allowed-origins", "--allowed-hosts", "--max-model-len",
               "--max-num-seqs", "--enable-prefix-caching", "--enforce-eager", "--chat-template", "--generation-config",
               "--enable-lora", "--lora-modules", "--max-loras", "--max-lora-rank", "--max-cpu-loras",
               "--tensor-parallel-size", "--enable-expert-parallel"]


@pytest.mark.parametrize(("command", "flags"), [("generate", FLAGS), ("serve", SERVE_FLAGS)])
def test_help_explains_every_flag(command: str, flags: list[str]):
    sub = build_parser()._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
    text = sub.format_help()
    for flag in flags:
        assert flag in text
    for action in sub._actions:
        assert action.help, f"{action.option_strings} has no help"


def test_invalid_value_is_a_clear_error_before_loading():
    result = _run("generate", "hi", "--temperature", "-1")
    assert result.returncode == 2
    assert "temperature" in result.stderr and "Traceback" not in result.stderr


def test_min_p_out_of_range_is_a_clear_error_before_loading():
    result = _run("generate", "hi", "--min-p", "1.5")
    assert result.returncode == 2
    assert "min_p must be in [0, 1]" in result.stderr and "Traceback" not in result.stderr


def test_missing_model_path_is_a_clear_error():
    result = _run("generate", "hi", "--model", "/nonexistent/model.gguf")
    assert result.returncode == 2 and "does not exist" in result.stderr


@pytest.mark.slow
def test_generate_streams_an_answer_from_the_bundled_model():
    result = _run("generate", "--chat", "What is the capital of France?", "--temperature", "0", "--max-tokens", "24")
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout
    assert "loaded SmolLM2-135M-Instruct" in result.stderr and "tok/s" in result.stderr


@pytest.mark.slow
def test_generate_with_a_draft_model_gives_the_plain_answer():
    """The bundled model drafting for itself (same GGUF): the greedy answer is the one plain decoding gives."""
    from infer.loader.gguf_file import bundled_smollm2

    args = ["generate", "--chat", "What is the capital of France?", "--temperature", "0", "--max-tokens", "24"]
    plain = _run(*args)
    drafted = _run(*args, "--speculative-method", "draft", "--draft-model", str(bundled_smollm2()),
                   "--num-speculative-tokens", "3")
    assert drafted.returncode == 0, drafted.stderr
    assert drafted.stdout == plain.stdout and "Paris" in drafted.stdout


def test_lora_flags_take_vllm_forms_and_refuse_a_name_twice(tmp_path):
    from infer.cli.flags import lora_options

    args = _serve_args("--enable-lora", "--lora-modules", f"a={tmp_path}", '{"name": "b", "path": "%s"}' % tmp_path,
                       "--max-loras", "3", "--max-lora-rank", "32", "--max-cpu-loras", "5")
    assert lora_options(args) == dict(enable_lora=True, max_loras=3, max_lora_rank=32, max_cpu_loras=5,
                                       lora_modules={"a": str(tmp_path), "b": str(tmp_path)})
    assert lora_options(_serve_args())["enable_lora"] is False
    with pytest.raises(ValueError, match="--lora-modules names a more than once"):
        lora_options(_serve_args("--lora-modules", f"a={tmp_path}", f"a={tmp_path}"))
    bad = _run("serve", "--lora-modules", "no-equals-sign")
    assert bad.returncode != 0 and "NAME=PATH" in bad.stderr


def test_generate_with_a_lora_adapter(tmp_path):
    """`infer generate --lora PATH` answers with the adapter (its greedy tokens differ from the base model's)."""
    from checkpoints import save_tiny_with_tokenizer
    from lora_adapters import save_adapter

    base = save_tiny_with_tokenizer("llama", tmp_path / "base")
    adapter = save_adapter(base, tmp_path / "ad", rank=8)
    args = ["generate", "--model", str(base), "hello", "--temperature", "0", "--max-tokens", "8", "--ignore-eos",
            "--device", "cpu"]
    plain, adapted = _run(*args), _run(*args, "--lora", str(adapter))
    assert adapted.returncode == 0, adapted.stderr
    assert adapted.stdout != plain.stdout
    missing = _run(*args, "--lora", str(tmp_path / "nowhere"))
    assert missing.returncode != 0 and "not a directory" in missing.stderr


def _serve_args(*flags: str):
    return build_parser().parse_args(["serve", *flags])


def test_access_flags_take_lists_as_commas_repeats_or_json(monkeypatch):
    from infer.cli.serve import access_policy

    monkeypatch.delenv("INFER_API_KEY", raising=False)
    args = _serve_args("--allowed-origins", "http://a.example,https://b.example:8443", "--allowed-origins",
                       '["http://c.example"]', "--allowed-hosts", "box.lan", "--api-key", "k1")
    policy = access_policy(args)
    assert policy.allowed_origins == ("http://a.example", "https://b.example:8443", "http://c.example")
    assert policy.allowed_hosts == ("box.lan",) and policy.api_key == "k1" and policy.bind_host == "127.0.0.1"


def test_the_api_key_comes_from_infer_api_key_unless_the_flag_gives_one(monkeypatch):
    from infer.cli.serve import access_policy

    monkeypatch.setenv("INFER_API_KEY", "from-env")
    assert access_policy(_serve_args()).api_key == "from-env"
    assert access_policy(_serve_args("--api-key", "from-flag")).api_key == "from-flag"
    monkeypatch.setenv("INFER_API_KEY", "")
    assert access_policy(_serve_args()).api_key is None


@pytest.mark.parametrize(("flags", "warned"), [
    (["--host", "0.0.0.0"], True), (["--host", "192.168.1.5"], True), (["--host", "::"], True),
    (["--host", "0.0.0.0", "--api-key", "k"], False), ([], False), (["--host", "localhost"], False),
    (["--host", "::1"], False),
])
def test_a_public_host_without_a_key_logs_one_warning(monkeypatch, capsys, flags, warned):
    from infer.cli.serve import access_policy

    monkeypatch.delenv("INFER_API_KEY", raising=False)
    access_policy(_serve_args(*flags))
    err = capsys.readouterr().err
    assert err.count("warning") == (1 if warned else 0), err
    if warned:
        assert "--api-key" in err and "INFER_API_KEY" in err


def test_vllm_flag_names_are_aliases_of_ours(tmp_path):
    from infer.cli.flags import ENGINE_FLAGS
    from infer.engine.config import EngineConfig

    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    ours = _serve_args("--max-seq-len", "2048", "--max-batch-size", "8", "--no-cuda-graphs", "--prefix-caching",
                       "--chat-template", str(template), "--generation-config", "vllm")
    vllm = _serve_args("--max-model-len", "2048", "--max-num-seqs", "8", "--enforce-eager", "--enable-prefix-caching",
                       "--chat-template", str(template), "--generation-config", "vllm")
    assert vars(ours) == vars(vllm)
    config = EngineConfig(**{name: getattr(vllm, name) for name in ENGINE_FLAGS})
    assert (config.max_seq_len, config.max_batch_size, config.use_prefix_caching) == (2048, 8, True)
    assert config.decode_graphs is False and config.chat_template == str(template)
    assert _serve_args("--no-enable-prefix-caching").use_prefix_caching is False
    assert _serve_args().use_cuda_graphs is None and _serve_args().generation_config == "auto"
    assert build_parser().parse_args(["generate", "hi", "--max-model-len", "512"]).max_seq_len == 512
    expert = _serve_args("-tp", "2", "--enable-expert-parallel")
    config = EngineConfig(**{name: getattr(expert, name) for name in ENGINE_FLAGS})
    assert (config.tensor_parallel_size, config.enable_expert_parallel) == (2, True)
    assert not _serve_args().enable_expert_parallel
    assert build_parser().parse_args(["generate", "hi", "-tp", "2", "--enable-expert-parallel"]).enable_expert_parallel


def test_serve_prints_the_sampling_defaults_a_generation_config_gives(tmp_path, capsys):
    from infer.cli.serve import show_sampling_defaults
    from infer.engine.config import EngineConfig

    (tmp_path / "generation_config.json").write_text('{"temperature": 0.6, "top_p": 0.95, "eos_token_id": 2}')
    show_sampling_defaults(EngineConfig(generation_config=str(tmp_path)))
    err = capsys.readouterr().err
    assert "temperature=0.6, top_p=0.95" in err and str(tmp_path / "generation_config.json") in err
    show_sampling_defaults(EngineConfig())  # the bundled GGUF has no generation config: nothing to say
    assert capsys.readouterr().err == ""


def test_a_chat_template_that_does_not_compile_fails_before_loading(tmp_path):
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% if %}")
    result = _run("serve", "--chat-template", str(bad))
    assert result.returncode == 2 and "bad.jinja, line 1" in result.stderr and "Traceback" not in result.stderr


def test_bad_access_flags_fail_before_loading_naming_the_flag():
    result = _run("serve", "--allowed-origins", "http://ui.example/")
    assert result.returncode == 2 and "--allowed-origins" in result.stderr and "Traceback" not in result.stderr
    result = _run("serve", "--allowed-hosts", "[not json")
    assert result.returncode == 2 and "--allowed-hosts" in result.stderr


def test_serve_bad_engine_option_fails_at_startup_naming_the_field():
    result = _run("serve", "--fairness-steps", "1")
    assert result.returncode == 2
    assert "fairness_steps=1" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_serve_answers_a_chat_request():
    import httpx

    from server_harness import serve_process

    with serve_process("--max-seq-len", "512") as served:
        base = served.base_url
        body = {"model": "SmolLM2-135M-Instruct", "temperature": 0, "max_tokens": 16,
                "messages": [{"role": "user", "content": "What is the capital of France?"}]}
        reply = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=60).json()
        assert "Paris" in reply["choices"][0]["message"]["content"]


@pytest.mark.slow
def test_export_tokenizer_renders_chats_as_the_server_does(tmp_path, smollm2_llm):
    from transformers import AutoTokenizer

    result = _run("export-tokenizer", str(tmp_path / "tok"))
    assert result.returncode == 0, result.stderr
    exported = AutoTokenizer.from_pretrained(tmp_path / "tok")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    ids = exported.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert list(ids) == smollm2_llm.encode_chat(messages)
    assert exported.encode("Hello world") == smollm2_llm.tokenizer.encode("Hello world")
