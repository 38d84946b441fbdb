"""Screenshots of the documentation site: the site built strict (``make docs``) into a temporary directory, served
on loopback, and each page taken by headless Chromium into a PNG. Run from a checkout::

    python -m lab.docs_screenshots                     # the front page and the configuration reference
    python -m lab.docs_screenshots --page reference/cli/=site-cli.png --out /tmp/shots

Needs a Chromium on PATH (Debian: ``apt-get install chromium``); without one it says so in one line and exits 2.
The default pages are those the docs show (``docs/img/site-*.png``, on the page about testing).
"""
from __future__ import annotations

import argparse
import functools
import http.server
import os
import shutil
import subprocess
import sys
import tempfile
import threading

DEFAULT_PAGES = {"": "site-front-page.png", "reference/config/": "site-config-reference.png"}
# Chromium as root in a closed network: no sandbox, no background connections (they are refused, many at a time)
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars"]


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # the pages it served are not news
        pass


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def build_site(site_dir: str) -> None:
    """The site as ``make docs`` builds it (strict) into ``site_dir``."""
    mkdocs = os.path.join(os.path.dirname(sys.executable), "mkdocs")
    subprocess.run([mkdocs, "build", "--strict", "--clean", "-q", "-d", site_dir], check=True,
                   env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def shoot(browser: str, url: str, png: str, width: int, height: int, profile: str) -> None:
    subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
                    f"--screenshot={png}", url], check=True, capture_output=True, timeout=120)
    if not os.path.getsize(png):
        raise RuntimeError(f"Chromium wrote an empty screenshot of {url}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--page", action="append", default=[], metavar="PATH=FILE.png",
                        help="a page of the site (its path, '' for the front page) and the PNG to write; "
                             "repeatable (default: the front page and the configuration reference)")
    parser.add_argument("--out", default=os.path.join("docs", "img"), help="where the PNGs go (default docs/img)")
    parser.add_argument("--size", default="1400x1000", help="the window, WIDTHxHEIGHT (default 1400x1000)")
    args = parser.parse_args(argv)
    browser = chromium()
    if browser is None:
        print("docs_screenshots: no Chromium on PATH; install one (Debian: apt-get install chromium)", file=sys.stderr)
        return 2
    pages = dict(p.split("=", 1) for p in args.page) if args.page else DEFAULT_PAGES
    width, height = (int(v) for v in args.size.lower().split("x"))
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mpca-shots-") as scratch:
        site = os.path.join(scratch, "site")
        build_site(site)
        handler = functools.partial(_QuietHandler, directory=site)
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            for path, name in pages.items():
                png = os.path.join(args.out, name)
                shoot(browser, f"http://127.0.0.1:{server.server_port}/{path}", png, width, height,
                      os.path.join(scratch, "profile"))
                print(f"{png}: /{path}")
        finally:
            server.shutdown()
            server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
