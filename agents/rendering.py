"""Message text as the page shows it: sanitized Markdown with highlighted code (UX-1).

One renderer on the server serves the first page load and every refresh the page makes while
it is open (the messages fragment), so the live view and a reload are the same HTML. While a
reply streams, the page shows its plain text; once the run ends the fragment replaces it
with this rendering, so a half-open code fence is never parsed mid-stream.
"""

from __future__ import annotations

import contextlib
from functools import lru_cache
from html import escape

import nh3
from markdown_it import MarkdownIt
from mdit_py_plugins.tasklists import tasklists_plugin
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

# Only what Markdown produces plus the code-block frame; raw HTML in a message is text
# (html=False) and this list is the second fence if a plugin ever lets markup through.
_TAGS = {
    "p", "br", "hr", "strong", "em", "s", "del", "code", "pre", "blockquote", "ul", "ol", "li",
    "h1", "h2", "h3", "h4", "h5", "h6", "a", "table", "thead", "tbody", "tr", "th", "td",
    "span", "div", "button", "input", "img",
}  # fmt: skip
_ATTRIBUTES = {
    "*": {"class"},
    "a": {"href", "title"},
    "th": {"style"},
    "td": {"style"},
    "ol": {"start"},
    "input": {"type", "checked", "disabled"},
    "button": {"type", "data-copy"},
    "div": {"data-lang"},
    "img": {"src", "alt", "title"},
}
_FORMATTER = HtmlFormatter(nowrap=True)
# A message can be long; highlighting megabytes of code would hold the page's render.
HIGHLIGHT_LIMIT = 100_000


def _fence(self, tokens, idx, options, env) -> str:  # noqa: ANN001 (markdown-it's renderer signature)
    token = tokens[idx]
    lang = token.info.strip().split(maxsplit=1)[0] if token.info.strip() else ""
    code = token.content
    body = escape(code)
    if lang and len(code) <= HIGHLIGHT_LIMIT:
        with contextlib.suppress(ClassNotFound):  # an unknown language stays plain text
            body = highlight(code, get_lexer_by_name(lang), _FORMATTER)
    label = escape(lang) if lang else "text"
    return (
        f'<div class="code-block" data-lang="{label}"><div class="code-head"><span class="code-lang">{label}</span>'
        f'<button type="button" class="copy" data-copy="code">Copy</button></div>'
        f'<pre class="highlight"><code>{body}</code></pre></div>\n'
    )


def _parser() -> MarkdownIt:
    # breaks: a single line break is a line break, as in every chat UI.
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False, "breaks": True})
    md.enable(["table", "strikethrough"])
    md.use(tasklists_plugin)
    md.add_render_rule("fence", _fence)
    md.add_render_rule("code_block", _fence)
    return md


_MD = _parser()


@lru_cache(maxsize=4096)
def markdown_html(text: str) -> str:
    """Sanitized HTML for a message's Markdown; links open in a new tab without an opener.

    Cached by text: stored messages never change, and a page shows the same ones again and again.
    """
    return nh3.clean(
        _MD.render(text),
        tags=_TAGS,
        attributes=_ATTRIBUTES,
        url_schemes={"http", "https", "mailto"},
        link_rel="noopener noreferrer nofollow",
        set_tag_attribute_values={"a": {"target": "_blank"}},
    )
