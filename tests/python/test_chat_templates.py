"""Chat templates rendered as Hugging Face renders them. `muser serve --chat-template-file` is
started with each Jinja chat template that llama.cpp's source ships (models/templates under
$MUSER_GGML_SRC: ~70 real models' templates) and asked through `POST /apply-template` for a
conversation; the same template is rendered by jinja2, set up the way transformers sets it up
(sandboxed, trim_blocks and lstrip_blocks, loop controls, the `{% generation %}` tag, `tojson`
without ASCII escapes, `raise_exception`). Each prompt must be the same string, byte for byte,
or both must refuse the conversation.

The one setting that differs on purpose: `strftime_now` gives a fixed date in Muser (so a
prompt does not change from day to day), and the reference is given the same date.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import requests

jinja2 = pytest.importorskip("jinja2")
from jinja2 import nodes  # noqa: E402
from jinja2.ext import Extension  # noqa: E402
from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: E402

from test_server import ServerProcess  # noqa: E402

SRC = os.environ.get("MUSER_GGML_SRC")
TEMPLATES = sorted(Path(SRC, "models", "templates").glob("*.jinja")) if SRC else []

WITH_SYSTEM = [
    {"role": "system", "content": "Answer in one line."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Italy? \u00e9\u00e8 \U0001F600"},
]
WITHOUT_SYSTEM = WITH_SYSTEM[1:]


class Generation(Extension):
    """transformers' `{% generation %}...{% endgeneration %}`: renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def reference_env() -> ImmutableSandboxedEnvironment:
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: "01 Jan 2026"
    return env


def apply(server: ServerProcess, messages) -> requests.Response:
    return requests.post(server.url + "/apply-template", json={"messages": messages}, timeout=60)


@pytest.fixture(scope="module")
def special_tokens(tmp_path_factory) -> dict[str, str]:
    """The default model's BOS and EOS texts, as the server hands them to a template."""
    probe = tmp_path_factory.mktemp("tmpl") / "probe.jinja"
    probe.write_text("{{ bos_token }}\n{{ eos_token }}")
    s = ServerProcess("--chat-template-file", str(probe))
    try:
        r = apply(s, WITHOUT_SYSTEM)
        assert r.status_code == 200, r.text
        bos, eos = r.json()["prompt"].split("\n")
    finally:
        s.stop()
    assert bos and eos
    return {"bos_token": bos, "eos_token": eos}


@pytest.mark.skipif(not TEMPLATES, reason="llama.cpp's source (MUSER_GGML_SRC) is not here")
def test_every_shipped_template_renders_as_transformers_does(special_tokens):
    env = reference_env()
    rendered = refused = 0
    for path in TEMPLATES:
        source = path.read_text()
        template = env.from_string(source)
        s = ServerProcess("--chat-template-file", str(path))
        try:
            for messages in (WITH_SYSTEM, WITHOUT_SYSTEM):
                try:
                    want = template.render(messages=messages, add_generation_prompt=True,
                                           **special_tokens)
                except jinja2.exceptions.TemplateError as e:
                    want, why = None, str(e)
                got = apply(s, messages)
                if want is None:
                    # Both refuse: a clear 400 naming the template's refusal.
                    assert got.status_code == 400, (path.name, got.text, why)
                    assert "chat template" in got.json()["error"]["message"], path.name
                    continue
                assert got.status_code == 200, (path.name, got.text)
                assert got.json()["prompt"] == want, path.name
                for m in messages:
                    assert m["content"] in want, (path.name, m)
                rendered += 1
                break
            else:
                refused += 1
        finally:
            s.stop()
    # Most real templates take one of the two conversations; a few need variables of their own.
    assert rendered >= 0.9 * len(TEMPLATES), (rendered, refused, len(TEMPLATES))


def test_apply_template_is_the_chat_prompt(special_tokens):
    """The default model's own template: /apply-template's prompt, tokenized (with BOS unless
    the template wrote it), is the prompt a chat request runs."""
    s = ServerProcess()
    try:
        prompt = apply(s, WITH_SYSTEM).json()["prompt"]
        bos_written = prompt.startswith(special_tokens["bos_token"])
        ids = requests.post(s.url + "/tokenize", timeout=60,
                            json={"content": prompt, "add_special": not bos_written}).json()["tokens"]
        r = requests.post(s.url + "/v1/chat/completions", timeout=60,
                          json={"messages": WITH_SYSTEM, "max_tokens": 1})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == len(ids)
        for m in WITH_SYSTEM:
            assert m["content"] in prompt
        bad = apply(s, [{"role": "wizard", "content": "x"}])
        assert bad.status_code == 400 and "role" in bad.json()["error"]["message"]
    finally:
        s.stop()
