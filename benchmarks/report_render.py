"""Render a `flytune report` page in headless Chromium and check that the screenshot is not blank.

  python benchmarks/report_render.py [SOURCE [SOURCE2]] [--png OUT.png] [--size 1200,1600]

SOURCE defaults to sample_pkg/artifacts/sm_90 (the committed H200 artifacts); the screenshot goes to
OUT.png (default: a temporary file). docs/images/report.png is made by

  python benchmarks/report_render.py --png docs/images/report.png

The page is opened from a file:// URL with every network feature of Chromium off. The PNG is decoded
with the stdlib (zlib and the five PNG row filters), and the page counts as rendered when it has many
distinct colours, a fair share of pixels that are not the background, and pixels of the winner's
orange (so the inline SVG charts and their style were drawn, not only text). Prints one JSON line;
exits 1 when the check fails or Chromium cannot run, 2 on a usage error.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars")
WINNER_RGB = (0xE8, 0x59, 0x0C)   # --win in review/page.py's style
MIN_COLOURS = 32
MIN_INK = 0.02                    # of the pixels, not the page's white
MIN_WINNER_PIXELS = 200


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def screenshot(html: Path, png: Path, size: tuple[int, int], timeout: float = 120) -> None:
    exe = chromium()
    if exe is None:
        raise RuntimeError("chromium is not installed (Debian: apt-get install -y chromium)")
    with tempfile.TemporaryDirectory() as profile:
        cmd = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--screenshot={png}",
               f"--window-size={size[0]},{size[1]}", html.resolve().as_uri()]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if not png.is_file():
        raise RuntimeError(f"chromium wrote no screenshot (exit {done.returncode}): {done.stderr[-2000:]}")


def decode_png(data: bytes) -> tuple[int, int, int, list[bytes]]:
    """(width, height, bytes per pixel, rows) of an 8-bit, non-interlaced grey, RGB or RGBA PNG."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, head = 8, [], None
    while pos + 8 <= len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            head = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    if head is None:
        raise ValueError("PNG without IHDR")
    width, height, depth, ctype, _, _, interlace = head
    if depth != 8 or interlace or ctype not in (0, 2, 4, 6):
        raise ValueError(f"unsupported PNG: depth {depth}, colour type {ctype}, interlace {interlace}")
    bpp = {0: 1, 2: 3, 4: 2, 6: 4}[ctype]
    raw = zlib.decompress(b"".join(idat))
    stride = width * bpp
    prev = bytearray(stride)
    rows = []
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        _unfilter(kind, line, prev, bpp)
        rows.append(bytes(line))
        prev = line
    return width, height, bpp, rows


def _unfilter(kind: int, line: bytearray, prev: bytearray, bpp: int) -> None:
    n = len(line)
    if kind == 1:
        for i in range(bpp, n):
            line[i] = (line[i] + line[i - bpp]) & 255
    elif kind == 2:
        for i in range(n):
            line[i] = (line[i] + prev[i]) & 255
    elif kind == 3:
        for i in range(n):
            line[i] = (line[i] + (((line[i - bpp] if i >= bpp else 0) + prev[i]) >> 1)) & 255
    elif kind == 4:
        for i in range(n):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], (prev[i - bpp] if i >= bpp else 0)
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    elif kind != 0:
        raise ValueError(f"unknown PNG row filter {kind}")


def inspect_png(path: Path) -> dict:
    width, height, bpp, rows = decode_png(path.read_bytes())
    counts: dict[bytes, int] = {}
    for row in rows:
        for i in range(0, len(row), bpp):
            px = row[i:i + 3] if bpp >= 3 else row[i:i + 1] * 3
            counts[px] = counts.get(px, 0) + 1
    background = max(counts, key=counts.get)
    total = width * height
    winner = sum(n for px, n in counts.items() if all(abs(px[j] - WINNER_RGB[j]) <= 6 for j in range(3)))
    return {"width": width, "height": height, "colours": len(counts),
            "ink": round(1 - counts[background] / total, 4), "winner_pixels": winner}


def rendered(info: dict) -> bool:
    return (info["colours"] >= MIN_COLOURS and info["ink"] >= MIN_INK
            and info["winner_pixels"] >= MIN_WINNER_PIXELS)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sources", nargs="*", metavar="SOURCE",
                    default=[os.path.relpath(ROOT / "sample_pkg/artifacts/sm_90")])
    ap.add_argument("--png", help="where the screenshot goes (default: a temporary file)")
    ap.add_argument("--size", default="1200,1600", help="window WIDTH,HEIGHT (default 1200,1600)")
    args = ap.parse_args(argv)
    if len(args.sources) > 2:
        ap.error("one source, or two to compare")
    try:
        size = tuple(int(v) for v in args.size.split(","))
        assert len(size) == 2 and min(size) > 0
    except (ValueError, AssertionError):
        ap.error("--size must be WIDTH,HEIGHT")
    sys.path.insert(0, str(ROOT))
    from flytune_build import review

    with tempfile.TemporaryDirectory() as tmp:
        html = Path(tmp) / "report.html"
        review.write(html, *args.sources)
        png = Path(args.png) if args.png else Path(tmp) / "report.png"
        png.parent.mkdir(parents=True, exist_ok=True)
        try:
            screenshot(html, png, size)
        except (RuntimeError, subprocess.TimeoutExpired, OSError) as e:
            print(f"report_render: {e}", file=sys.stderr)
            return 1
        info = {"sources": args.sources, "png": str(png) if args.png else None, "html_bytes": html.stat().st_size,
                **inspect_png(png)}
    info["rendered"] = rendered(info)
    print(json.dumps(info))
    return 0 if info["rendered"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
