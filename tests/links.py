"""Links on a page, as a person's browser would follow them: same-origin GET hrefs of <a> elements."""

from __future__ import annotations

from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit, urlunsplit

ORIGIN = "http://testserver"  # Django's test client


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            href = dict(attrs).get("href")
            if href:
                self.hrefs.append(href)


def page_links(html: str, *, page: str) -> list[str]:
    """Path + query of every same-origin link on ``page`` (fragments dropped), in page order."""
    parser = _Anchors()
    parser.feed(html)
    found: list[str] = []
    for href in parser.hrefs:
        href = href.strip()
        if href.startswith(("javascript:", "mailto:", "tel:", "data:")):
            continue
        parts = urlsplit(urljoin(ORIGIN + page, href))
        if f"{parts.scheme}://{parts.netloc}" != ORIGIN:
            continue
        link = urlunsplit(("", "", parts.path or "/", parts.query, ""))
        if link not in found:
            found.append(link)
    return found
