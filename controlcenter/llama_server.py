"""llama-cpp-python's OpenAI-compatible server, run as `python -m controlcenter.llama_server ARGS`.

Its `chatml-function-calling` format renders the prompt with a Jinja environment that escapes
HTML (llama-cpp-python 0.3.x): every `"` of the tool schemas and messages reached the model as
`&#34;`, every `<` as `&lt;`. The model read 2,658 tokens where the text held 978, so a prompt the
Context view showed at 42 % of the window overflowed it, and the model copied the entities into its
replies and tool arguments. A prompt is text, not HTML: the environment is built without escaping.
"""

from __future__ import annotations

import runpy
from typing import Any

import llama_cpp.llama_chat_format as chat_format


class _TextEnvironment(chat_format.ImmutableSandboxedEnvironment):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{**kwargs, "autoescape": False})


# The formatters look the class up in their module when they render, so this is the one they build.
chat_format.ImmutableSandboxedEnvironment = _TextEnvironment  # type: ignore[misc]  # replacing a class on purpose

if __name__ == "__main__":
    runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
