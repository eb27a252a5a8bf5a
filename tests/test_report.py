"""`flytune report`: the page is built from real artifacts and read back with html.parser, as a reviewer's
browser would read it: a chart per kernel and shape, the winner marked, nothing fetched from outside,
hostile names shown as text, changed winners listed, older artifacts rendered; and once in Chromium."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from buildkit import artifact, make_project

from flytune_build import review
from flytune_build.audit.source import open_source
from flytune_build.cli import report
from flytune_build.core.artifact import Artifact, load_dir
from flytune_build.core.config import Config
from flytune_build.core.device import DeviceIdentity
from flytune_build.core.errors import UsageError
from flytune_build.review import shape as shape_mod

ROOT = Path(__file__).resolve().parent.parent
SM90 = ROOT / "sample_pkg" / "artifacts" / "sm_90"
INTERP = ROOT / "sample_pkg" / "artifacts" / "interpreter"
HOSTILE = "<script>alert(1)</script>"
VOID = {"br", "meta", "img", "input", "link", "hr", "wbr", "area", "base", "col", "embed", "source", "track"}


class Node:
    def __init__(self, tag, attrs, parent=None):
        self.tag, self.attrs, self.parent, self.children, self.text = tag, dict(attrs), parent, [], []

    def all(self, tag=None, **attrs):
        """Every descendant with this tag (any, if None) whose attributes contain these values."""
        out = []
        for c in self.children:
            if (tag is None or c.tag == tag) and all(_has(c.attrs.get(k.rstrip("_").replace("_", "-")), v)
                                                     for k, v in attrs.items()):
                out.append(c)
            out += c.all(tag, **attrs)
        return out

    def content(self) -> str:
        return "".join(self.text) + "".join(c.content() for c in self.children)


def _has(value, want):
    return value is not None and (value == want or want in value.split())


class Tree(HTMLParser):
    def __init__(self, text):
        super().__init__(convert_charrefs=True)
        self.root = self.node = Node("#document", {})
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        node = Node(tag, attrs, self.node)
        self.node.children.append(node)
        if tag not in VOID:
            self.node = node

    def handle_startendtag(self, tag, attrs):
        self.node.children.append(Node(tag, attrs, self.node))

    def handle_endtag(self, tag):
        n = self.node
        while n is not self.root and n.tag != tag:
            n = n.parent
        if n is not self.root:
            self.node = n.parent

    def handle_data(self, data):
        self.node.text.append(data)


def page(*sources) -> Node:
    return Tree(review.render(*sources)).root


def kernels(doc: Node) -> dict[str, Node]:
    return {s.attrs["data-kernel"]: s for s in doc.all("section", class_="kernel")}


@pytest.mark.parametrize("directory", [SM90, INTERP], ids=["sm_90", "interpreter"])
def test_each_kernel_has_a_chart_per_shape_with_its_winner_marked(directory):
    arts = load_dir(directory)
    doc = page(directory)
    found = kernels(doc)
    assert set(found) == {a.kernel for a in arts}
    for name, section in found.items():
        mine = {a.address[:16]: a for a in arts if a.kernel == name}
        shapes = section.all("article", class_="shape")
        assert {s.attrs["id"].removeprefix("shape-") for s in shapes} == set(mine)
        for s in shapes:
            art = mine[s.attrs["id"].removeprefix("shape-")]
            (svg,) = s.all("svg", class_="chart")
            winners = svg.all("rect", data_role="winner")
            bars = [w for w in winners if _has(w.attrs.get("class"), "bar")]
            assert len(bars) == 1, "exactly one winner bar"
            assert shape_mod.label(art.config) in bars[0].content()
            assert len(svg.all("rect", class_="bar")) == len(art.provenance["candidates"])


def test_the_tie_band_and_finalists_are_drawn_where_the_selection_was_recorded():
    doc = page(SM90)
    for s in doc.all("article", class_="shape"):
        (svg,) = s.all("svg", class_="chart")
        assert svg.all("rect", class_="band"), "the band is shaded"
        assert svg.all("circle", class_="round"), "the finalists' rounds are drawn"
        assert svg.all("rect", class_="median", data_role="winner"), "the winner's median is marked"
    facts = doc.all("dl", class_="facts")[0].content()
    assert "cuda-graph" in facts or "cuda-events" in facts


def test_the_page_references_nothing_outside_itself():
    text = review.render(SM90)
    doc = Tree(text).root
    assert "http://" not in text and "https://" not in text
    assert not doc.all("script") and not doc.all("link") and not doc.all("img") and not doc.all("iframe")
    for node in doc.all():
        assert not {"src", "srcset", "xlink:href"} & set(node.attrs), node.tag
        assert node.attrs.get("href", "#").startswith("#"), node.attrs
        assert not any((v or "").startswith("//") for v in node.attrs.values()), node.attrs
    assert "url(" not in text and "@import" not in text
    (csp,) = doc.all("meta", http_equiv="Content-Security-Policy")
    assert csp.attrs["content"].startswith("default-src 'none'")


def hostile_dir(tmp: Path) -> Path:
    """An artifact whose every free-text field is markup, and a file the reader refuses, named as markup."""
    d = tmp / "hostile"
    d.mkdir()
    dev = DeviceIdentity("cuda", "sm_90", "<img src=x onerror=alert(2)>", 132)
    win = Config({"BLOCK": 64, "MODE": '"><script>alert(3)</script>'}, num_warps=4)
    other = Config({"BLOCK": 32, "MODE": "</svg><script>alert(4)</script>"}, num_warps=2)
    prov = {"triton": "</td><script>alert(5)</script>", "host": "<b>host</b>", "ranking": "measured",
            "candidates": [{"config": other.to_json(), "time_ms": 0.02}, {"config": win.to_json(), "time_ms": 0.01},
                           {"config": win.to_json(), "time_ms": None, "error": HOSTILE}],
            "selection": {"winner": 1, "why": "<svg onload=alert(6)>", "band": 0.02,
                          "finalists": [{"index": 1, "median_ms": 0.01, "rounds_ms": [0.01, 0.0101]}]},
            "measurement": {"timer": "cuda-graph", "note": "<iframe src=//evil.example>"}}
    Artifact("evil.kernel", {"x": HOSTILE, "n": 1}, dev, win, prov).save(d)
    doc = Artifact("evil.other", {"n": 1}, dev, win).to_json()
    doc["kernel"] = HOSTILE  # refused by the reader: its error quotes the name
    (d / "<b>bad<b>-0123456789abcdef.json").write_text(json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n")
    for name in (b"\xe2\x80\xaeevil-0123456789abcdef.json",   # a bidi override
                 b"bad\xff-0123456789abcdef.json"):           # not UTF-8
        with open(os.path.join(os.fsencode(d), name), "w") as f:
            f.write("{}")
    return d


def test_hostile_names_are_shown_as_text_never_as_markup(tmp_path):
    d = hostile_dir(tmp_path)
    out = review.write(tmp_path / "r.html", d)
    text = out.read_text("utf-8")
    doc = Tree(text).root
    for tag in ("script", "img", "iframe", "b"):
        assert not doc.all(tag), f"a <{tag}> from data became an element"
    assert not [n for n in doc.all() if any(a.startswith("on") for a in n.attrs)]
    shown = doc.content()
    for s in (HOSTILE, "<img src=x onerror=alert(2)>", '"><script>alert(3)</script>', "<svg onload=alert(6)>",
              "</td><script>alert(5)</script>", "<b>bad<b>-0123456789abcdef.json"):
        assert s in shown, f"{s!r} is not shown as text"
    assert "evil.kernel" in kernels(doc)
    assert "\u202e" not in text and "\\u202eevil" in shown and "bad\\udcff" in shown


def test_numbers_a_float_cannot_hold_are_left_out_never_drawn_as_nan(tmp_path):
    """Times near 1e308 or a subnormal (their differences and ratios overflow) are valid provenance: the
    page is written, and no coordinate or percentage of it is nan or inf. A JSON integer no double holds
    (400 digits) is no valid provenance: the page lists that artifact's error, naming the field."""
    d = tmp_path / "extreme"
    d.mkdir()
    dev = DeviceIdentity("cuda", "sm_90", "NVIDIA H200", 132)
    configs = [Config({"BLOCK": b}, num_warps=4) for b in (16, 32, 64, 128)]
    prov = {"candidates": [{"config": configs[0].to_json(), "time_ms": 1e300},
                           {"config": configs[1].to_json(), "time_ms": 1.7e308},
                           {"config": configs[2].to_json(), "time_ms": 5e-324},
                           {"config": configs[3].to_json(), "time_ms": 0.01}],
            "selection": {"winner": 3, "band": 1.7e308, "why": "extreme",
                          "finalists": [{"index": 1, "median_ms": 1.7e308, "rounds_ms": [1.7e308, -1.7e308]},
                                        {"index": 3, "median_ms": -1.7e308, "dispersion_ms": 1.7e308}],
                          "shipped": {"outcome": "kept", "gain": 1.7e308}},
            "measurement": {"timer": "cuda-graph", "estimate_ms": 1.7e308, "warmup_ms": 1.7e308}}
    Artifact("big.kernel", {"n": 1}, dev, configs[3], prov).save(d)
    text = review.write(tmp_path / "r.html", d).read_text("utf-8")
    doc = Tree(text).root
    assert "big.kernel" in kernels(doc)
    for node in doc.all():
        for name, value in node.attrs.items():
            assert not {"nan", "inf"} & set(re.findall(r"[a-z]+", (value or "").lower())), \
                (node.tag, name, value)
    assert "inf%" not in doc.content() and "nan" not in doc.content().lower().split()
    data = json.loads(next(d.iterdir()).read_bytes())
    data["provenance"]["candidates"][0]["time_ms"] = 10 ** 400
    next(d.iterdir()).write_text(json.dumps(data))
    text = review.write(tmp_path / "r2.html", d).read_text("utf-8")
    assert "`provenance.candidates[0].time_ms` must be a finite number" in Tree(text).root.content()


def test_the_page_is_never_written_over_its_source(tmp_path):
    wheel = tmp_path / "mypkg-1.0-py3-none-any.whl"
    wheel.write_bytes(b"not a zip, but the user's file")
    assert run_report(str(wheel), "--output", str(wheel)) == 2
    assert wheel.read_bytes() == b"not a zip, but the user's file"
    d = tmp_path / "arts"
    shutil.copytree(SM90, d)
    before = sorted(p.name for p in d.iterdir())
    assert run_report(str(SM90), str(d), "--output", str(d / "review.json")) == 2
    assert sorted(p.name for p in d.iterdir()) == before
    with pytest.raises(UsageError):
        review.write(wheel, wheel)
    assert run_report(str(d), "--output", str(d / "review.html")) == 0  # a page beside the artifacts is fine


def test_the_page_never_replaces_a_file_report_did_not_write(tmp_path, capsys, monkeypatch):
    """A project's own inputs (pyproject.toml, the tuning plan, the tune state), or any other file, are
    refused before anything is read; a page `report` wrote is replaced."""
    proj = make_project(tmp_path / "proj")
    (proj / "tune").mkdir()
    (proj / "tune" / "plan.toml").write_text("[[entries]]\n")
    (proj / ".flytune-tune-state").write_text("{}\n")
    (tmp_path / "notes.html").write_text("<!DOCTYPE html>\n<p>mine</p>\n")
    opened = []
    from flytune_build.audit import source

    monkeypatch.setattr(source, "open_source", lambda p: opened.append(p) or open_source(p))
    for out in (proj / "pyproject.toml", proj / "tune" / "plan.toml", proj / ".flytune-tune-state",
                tmp_path / "notes.html"):
        before = out.read_bytes()
        assert run_report(str(proj), "--output", str(out)) == 2, out
        assert out.read_bytes() == before and not opened   # refused before any source was read
        assert f"flytune: error: --output {out}: exists and is not a page `flytune report` wrote" in \
            capsys.readouterr().err
    with pytest.raises(UsageError, match="not a page"):
        review.write(proj / "pyproject.toml", proj)
    out = tmp_path / "r.html"
    assert run_report(str(proj), "--output", str(out)) == 0 and opened
    assert run_report(str(SM90), "--output", str(out)) == 0   # its own page: replaced
    assert "sample_pkg.matmul" in out.read_text("utf-8")
    (tmp_path / "made.html").write_bytes(b"")   # `mktemp`'s empty file: nothing in it to lose
    assert run_report(str(proj), "--output", str(tmp_path / "made.html")) == 0


def test_artifacts_of_older_releases_render_what_they_have(tmp_path):
    d = tmp_path / "old"
    dev = DeviceIdentity("cuda", "sm_80", "NVIDIA A100-SXM4-80GB", 108)
    cfg = Config({"BLOCK": 128}, num_warps=4)
    Artifact("pkg.bare", {"n": 1}, dev, cfg).save(d)                                # no provenance at all
    Artifact("pkg.versions", {"n": 2}, dev, cfg, {"triton": "2.3.0"}).save(d)      # no candidates
    Artifact("pkg.failed", {"n": 3}, dev, cfg, {"candidates": [                     # one failed, winner untimed
        {"config": Config({"BLOCK": 256}).to_json(), "time_ms": None, "error": "out of resources"},
        {"config": cfg.to_json(), "time_ms": None}]}).save(d)
    Artifact("pkg.stray", {"n": 4}, dev, cfg, {"candidates": [{"config": cfg.to_json(), "time_ms": 0.5}],
                                               "selection": {"winner": 4000, "fastest": 17, "band": 0.02,
                                                             "finalists": [{"index": 9, "median_ms": 0.5}]}}).save(d)
    doc = page(d)
    found = kernels(doc)
    assert set(found) == {"pkg.bare", "pkg.versions", "pkg.failed", "pkg.stray"}
    assert "no candidates recorded" in found["pkg.bare"].content()
    assert "2.3.0" in doc.all("table", class_="toolchain")[0].content()
    failed = found["pkg.failed"]
    marks = [(t.all("title")[0].content(), "".join(t.text)) for t in failed.all("text", class_="failed")]
    assert marks == [("out of resources", "failed"), ("no time recorded", "not timed")]
    stray = found["pkg.stray"]
    assert len(stray.all("rect", class_="bar", data_role="winner")) == 1
    assert not stray.all("circle", class_="round"), "a finalist index naming no candidate is ignored"


def changed_copy(tmp: Path) -> tuple[Path, Artifact, Config]:
    """sm_90 copied, one winner replaced by the run's second-fastest candidate."""
    new = tmp / "new"
    shutil.copytree(SM90, new)
    art = Artifact.load(new / "sample_pkg.softmax-21e78faefab8d86b.json")
    timed = sorted((c for c in art.provenance["candidates"] if c["time_ms"] is not None), key=lambda c: c["time_ms"])
    other = next(Config.coerce(c["config"]) for c in timed if Config.coerce(c["config"]) != art.config)
    Artifact(art.kernel, art.key, art.device, other, art.provenance).save(new)  # same identity: same file
    return new, art, other


def test_comparing_two_directories_shows_the_changed_winner_and_by_how_much(tmp_path):
    new, old_art, other = changed_copy(tmp_path)
    doc = page(SM90, new)
    (row,) = doc.all("tr", data_role="changed")
    cells = [td.content() for td in row.all("td")]
    assert cells[0] == old_art.kernel
    assert cells[3] == shape_mod.label(old_art.config) and cells[4] == shape_mod.label(other)
    times = {shape_mod.label(Config.coerce(c["config"])): c["time_ms"] for c in old_art.provenance["candidates"]}
    margin = times[shape_mod.label(old_art.config)] / times[shape_mod.label(other)] - 1
    want = f"{margin * 100:.1f}% slower" if margin >= 0 else f"{-margin * 100:.1f}% faster"
    assert cells[5] == want
    (changed,) = doc.all("article", data_changed="yes")
    assert changed.attrs["id"] == f"shape-{old_art.address[:16]}"
    assert changed.all("rect", class_="bar", data_role="previous"), "the previous winner is drawn in the chart"
    assert "1 changed winner(s), 0 added, 0 removed, 14 unchanged" in doc.all("section", id="changes")[0].content()


def run_report(*argv) -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    report.add_command(lambda name, help, codes: sub.add_parser(name, help=help))
    return report.command(parser.parse_args(["report", *argv]))


def test_the_command_writes_the_page_and_exits_0(tmp_path, capsys):
    out = tmp_path / "r.html"
    assert run_report(str(SM90), "--output", str(out)) == 0
    assert len(kernels(Tree(out.read_text("utf-8")).root)) == 3
    assert "3 kernel(s), 15 tuned shape(s)" in capsys.readouterr().out


def test_a_source_that_cannot_be_read_is_listed_on_the_page_and_exits_1(tmp_path, capsys):
    out = tmp_path / "r.html"
    assert run_report(str(tmp_path / "missing"), str(SM90), "--output", str(out)) == 1
    assert "missing" in capsys.readouterr().err
    doc = Tree(out.read_text("utf-8")).root
    assert "missing" in doc.all("ul", class_="errors")[0].content()
    assert len(kernels(doc)) == 3, "what can be read is still shown"


def test_usage_errors_exit_2_and_write_nothing(tmp_path):
    with pytest.raises(SystemExit) as e:
        run_report(str(SM90), str(SM90), str(SM90), "--output", str(tmp_path / "r.html"))
    assert e.value.code == 2
    assert run_report(str(SM90), "--output", str(tmp_path)) == 2
    assert run_report(str(SM90), "--output", str(tmp_path / "no" / "r.html")) == 2
    assert not list(tmp_path.iterdir())


def test_flytune_report_runs_from_the_cli(tmp_path):
    from flytune_build.cli.main import main

    out = tmp_path / "r.html"
    assert main(["report", str(INTERP), "--output", str(out)]) == 0
    assert len(kernels(Tree(out.read_text("utf-8")).root)) == 3


def test_a_project_source_shows_its_declared_targets(tmp_path):
    proj = make_project(tmp_path / "proj")
    doc = page(proj)
    assert set(kernels(doc)) == {"fixpkg.add"}
    assert len(doc.all("article", class_="shape")) == 2
    heads = [th.content() for th in doc.all("table", class_="coverage")[0].all("th")]
    assert "interpreterexact" in heads[1].replace(" ", "") and heads[2].startswith("sm_90/132/NVIDIA H200")


def test_a_wheel_and_its_project_give_the_same_charts(tmp_path):
    from buildkit import pip_wheel
    from conftest import python_env

    proj = make_project(tmp_path / "p", artifacts=load_dir(INTERP) + load_dir(SM90))
    r = pip_wheel(proj, tmp_path / "dist", env=python_env())
    assert r.returncode == 0, r.stderr
    (whl,) = (tmp_path / "dist").glob("*.whl")
    src = open_source(str(whl))
    assert src.kind == "wheel" and src.ok, src.errors

    def charts(doc):
        return [(a.attrs["id"], a.all("svg", class_="chart")[0].content()) for a in doc.all("article", class_="shape")]

    assert len(charts(page(src))) == 24
    assert charts(page(src)) == charts(page(proj))


def test_the_report_never_imports_torch_or_triton(tmp_path):
    code = ("import sys; from flytune_build import review; review.write(sys.argv[1], sys.argv[2], sys.argv[3]); "
            "print(sorted(m for m in ('torch', 'triton', 'numpy') if m in sys.modules))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "r.html"), str(INTERP), str(SM90)],
                       capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_the_same_sources_give_the_same_bytes():
    assert review.render(SM90) == review.render(open_source(str(SM90)))


CHROMIUM = Path("/usr/bin/chromium")


@pytest.mark.skipif(not CHROMIUM.exists(), reason="headless Chromium is not installed (apt-get install -y chromium)")
def test_the_page_renders_in_headless_chromium(tmp_path):
    spec = importlib.util.spec_from_file_location("report_render", ROOT / "benchmarks" / "report_render.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "report_render.py"), str(SM90),
                        "--png", str(tmp_path / "r.png"), "--size", "900,1200"], capture_output=True, text=True,
                       check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    info = json.loads(r.stdout)
    assert info["rendered"] and info["width"] == 900 and info["winner_pixels"] > 0
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>")
    script.screenshot(blank, tmp_path / "blank.png", (400, 300))
    assert not script.rendered(script.inspect_png(tmp_path / "blank.png")), "a blank page is told apart"


def test_a_synthetic_ranking_is_labelled_a_rank_never_milliseconds(tmp_path):
    from flytune_build.review import shape as shape_mod

    art = artifact(100, 32)  # ranking: synthetic
    s = shape_mod.read(art.with_provenance({"ranking": "synthetic", "candidates": [
        {"config": {"kwargs": {"BLOCK": 32}, "num_warps": 4}, "time_ms": 1.25},
        {"config": {"kwargs": {"BLOCK": 64}, "num_warps": 4}, "time_ms": 1.5}]}))
    assert s.unit == "rank"
    from flytune_build.review import page

    html = str(page._table(s))
    assert "synthetic rank (no time)" in html and "time (ms)" not in html
