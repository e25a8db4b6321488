"""Checks that the built documentation site renders: every page in a headless Chromium, screenshots of the main ones.

`make docs-check` runs it after `make docs` built site/ (strict: broken links and anchors already failed there).
What a build cannot see and this does: a page whose Markdown renders to something else than its title and text
(an unclosed code fence swallows the rest of the page), an image that does not load, a theme asset that is missing.
Pages are served over HTTP from site/ (as a reader's browser gets them: Material's search and navigation fetch
files, which file:// URLs refuse) and loaded in Chromium's headless mode; each page's rendered DOM must hold its
title as the first heading, every image must have loaded with a width, and no code block may be wider than the
page column (a reader sees it cut off). Screenshots of SCREENSHOT_PAGES go to
site/_screenshots/ for a person to look at (a test cannot say whether a diagram reads well).
"""

from __future__ import annotations

import argparse
import functools
import http.server
import re
import shutil
import subprocess
import sys
import threading
from html import unescape as html_unescape
from html.parser import HTMLParser
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCREENSHOT_PAGES = ["", "getting-started/", "architecture/", "observability/", "reference/config/"]
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
WIDTH = 1280  # a laptop's browser window: the page column is what Material's layout leaves of it

# Run in the page after it loaded: the first heading and each image's state, printed into the DOM dump's title.
PROBE = """
<script>
window.addEventListener('load', () => {
  const h1 = document.querySelector('article h1');
  const broken = [...document.querySelectorAll('article img')].filter(i => !i.complete || i.naturalWidth === 0);
  // A code block wider than the page column: the reader sees it cut off on the right (Material scrolls it).
  const wide = [...document.querySelectorAll('article pre > code')].filter(c => c.scrollWidth > c.clientWidth + 2)
    .map(c => c.textContent.split('\\n').reduce((a, b) => (b.length > a.length ? b : a), '').trim().slice(0, 60));
  document.title = 'PROBE|' + (h1 ? h1.textContent.trim() : '') + '|' + broken.map(i => i.src).join(',') + '|' + wide.join('\u241e');
});
</script>
"""


class _Headings(HTMLParser):
    """The first <h1> of a built page's article, as the Markdown source wrote it."""

    def __init__(self):
        super().__init__()
        self.inside, self.text = False, None

    def handle_starttag(self, tag, attrs):
        if tag == "h1" and self.text is None:
            self.inside, self.text = True, ""

    def handle_endtag(self, tag):
        if tag == "h1":
            self.inside = False

    def handle_data(self, data):
        if self.inside:
            self.text += data


def browser() -> str:
    for name in BROWSERS:
        if shutil.which(name):
            return shutil.which(name)
    sys.exit("docs-check needs a headless Chromium: apt-get install chromium (Debian), then make docs-check")


def serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def chromium(exe: str, *args: str) -> str:
    # --no-sandbox: CI and this project's machines run as root, where Chromium's sandbox refuses to start.
    run = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--virtual-time-budget=5000",
           f"--window-size={WIDTH},900", *args]
    return subprocess.run(run, capture_output=True, text=True, timeout=30).stdout  # a page takes ~3 s


def check_page(exe: str, site: Path, base: str, html: Path) -> list[str]:
    """Problems of one page: its rendered first heading against the built one, and images that did not load."""
    parser = _Headings()
    parser.feed(html.read_text())
    expected = (parser.text or "").replace("¶", "").strip()
    probe = html.with_name("_probe_" + html.name)  # a copy with the probe script; the served page stays as built
    probe.write_text(html.read_text().replace("</body>", PROBE + "</body>"))
    try:
        dom = chromium(exe, "--dump-dom", base + probe.relative_to(site).as_posix())
    finally:
        probe.unlink()
    found = re.search(r"<title>PROBE\|(.*?)\|(.*?)\|(.*?)</title>", dom, re.S)
    name = html.relative_to(site).as_posix()
    if not found:
        return [f"{name}: the page did not finish loading in Chromium"]
    heading, broken, wide = found.group(1).replace("¶", "").strip(), found.group(2), found.group(3)
    problems = [f"{name}: first heading rendered as {heading!r}, built as {expected!r}"] if heading != expected else []
    problems += [f"{name}: a code block is wider than the page column (cut off on the right at {WIDTH}px): {html_unescape(line)!r}..."
                 for line in wide.split("\u241e") if line]
    return problems + [f"{name}: image did not load: {src}" for src in broken.split(",") if src]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", type=Path, default=REPO / "site", help="the built site (make docs)")
    args = parser.parse_args(argv)
    if not (args.site / "index.html").is_file():
        sys.exit(f"no built site in {args.site}: run make docs first")
    exe = browser()
    server, base = serve(args.site)
    try:
        pages = sorted(p for p in args.site.rglob("index.html") if not p.relative_to(args.site).parts[0].startswith(("_", "assets", "search")))
        problems = [problem for page in pages for problem in check_page(exe, args.site, base, page)]
        shots = args.site / "_screenshots"
        shots.mkdir(exist_ok=True)
        for page in SCREENSHOT_PAGES:
            out = shots / ((page.strip("/").replace("/", "_") or "index") + ".png")
            chromium(exe, f"--screenshot={out}", base + page)
            if not out.is_file() or out.stat().st_size < 10_000:
                problems.append(f"{page or 'index'}: no screenshot (or a blank one) at {out}")
    finally:
        server.shutdown()
    for problem in problems:
        print(problem)
    print(f"docs-check: {len(pages)} pages rendered in Chromium, {len(problems)} problem(s); screenshots in {shots}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
