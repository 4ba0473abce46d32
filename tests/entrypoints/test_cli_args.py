"""`vllm serve MODEL [flags]` and the api_server module parse the same flags: the server's own
and every engine flag of EngineArgs."""
import pytest

from vllm.engine.arg_utils import EngineArgs
from vllm.entrypoints.cli.main import make_parser
from vllm.entrypoints.openai.api_server import load_chat_template


def test_serve_parses_model_and_flags():
    args = make_parser().parse_args(
        ["serve", "/models/m", "--port", "8123", "--host", "127.0.0.1", "--api-key", "k",
         "--served-model-name", "m", "--max-num-seqs", "4", "--speculative-model", "[ngram]",
         "--num-speculative-tokens", "3", "--enforce-eager", "--disable-log-requests"])
    assert args.model_tag == "/models/m" and args.port == 8123 and args.api_key == "k"
    engine_args = EngineArgs.from_cli_args(args)
    assert engine_args.max_num_seqs == 4 and engine_args.served_model_name == "m"
    assert engine_args.num_speculative_tokens == 3 and engine_args.enforce_eager is True


def test_serve_needs_a_subcommand_and_rejects_unknown_flags():
    with pytest.raises(SystemExit):
        make_parser().parse_args([])
    with pytest.raises(SystemExit):
        make_parser().parse_args(["serve", "m", "--no-such-flag"])


def test_chat_template_flag(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text("{{ messages[0]['content'] }}")
    assert load_chat_template(str(path)) == "{{ messages[0]['content'] }}"
    assert load_chat_template("{% for m in messages %}{% endfor %}").startswith("{%")
    with pytest.raises(ValueError, match="chat-template"):
        load_chat_template("missing.jinja")
