"""``attrib-bench report``: a self-contained HTML page (rendered in Chromium) and Markdown."""

from __future__ import annotations

import base64
import copy
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from test_check import document as check_document

from attrib_bench.core.errors import UsageError
from attrib_bench.reports.attributions import read_attributions
from attrib_bench.reports.html import render_html
from attrib_bench.reports.markdown import render_markdown
from attrib_bench.reports.plots import layer_figure
from attrib_bench.results.typed import load_results
from attrib_bench.runner.cache import NO_CACHE_ENV

CHROMIUM = next(
    (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)),
    None,
)
RUN = ("--limit", "6", "--batch-size", "3", "--quiet")


@pytest.fixture(scope="module")
def result(tiny_bert, tmp_path_factory) -> Path:
    """A cached run of two layer-wise methods (the saliency reference and random floor join),
    made once for the tests that report it: the result names its cache folder, where the
    report finds the token-level rows."""
    from attrib_bench.cli import main

    folder = tmp_path_factory.mktemp("report")
    output = folder / "result.json"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTRIB_BENCH_CACHE", str(folder / "cache"))  # never the user's cache
        patch.delenv(NO_CACHE_ENV, raising=False)
        args = ["--model", str(tiny_bert), "--attributors", "attention,rollout", *RUN]
        assert main(["run", *args, "--output", str(output)]) == 0
    return output


def spans(row_html: str) -> list[str]:
    return re.findall(r'<span class="tok"[^>]*>([^<]*)</span>', row_html)


def test_html_report_is_self_contained_with_every_part(result, run_cli, tmp_path):
    import matplotlib.image

    page, markdown = tmp_path / "report" / "r.html", tmp_path / "report" / "r.md"
    code, out, err = run_cli("report", result, "--html", page, "--markdown", markdown)
    assert code == 0, err
    assert out == ""
    html = page.read_text()
    document = json.loads(result.read_text())

    # Self-contained: no script, no stylesheet link, nothing fetched but data: URIs.
    assert html.startswith("<!DOCTYPE html>")
    assert "<script" not in html and "<link" not in html
    assert re.findall(r'(?:src|href)="(?!data:)', html) == []

    # Leaderboards, best first, with their CI and cost columns.
    board = html[html.index("Leaderboard: spearman vs saliency (aggregated rows)") :]
    order = re.findall(r"<td><code>([^<]+)</code></td>", board[: board.index("</table>")])
    means = {
        s: document["methods"][s]["scores"]["spearman"]["aggregated"][-1]["mean"] for s in order
    }
    assert set(order) == {"attention", "rollout", "random", "saliency"}  # saliency: the reference
    assert [means[s] for s in order] == sorted(means.values(), reverse=True)
    assert "Leaderboard: spearman vs saliency (local rows)" in html

    # The per-layer plot: a real PNG with content.
    (encoded,) = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    png = base64.b64decode(encoded)
    assert png.startswith(b"\x89PNG")
    pixels = matplotlib.image.imread(io.BytesIO(png))
    assert pixels.shape[0] > 200 and pixels.std() > 0.05

    # Heatmaps: every method (and the reference) over every token of the first examples.
    for example in document["example_ids"]:
        section = html.index(f"Example <code>{example}</code>")
        table = html[section : html.index("</table>", section)]
        rows = re.findall(r"<tr>(.*?)</tr>", table)
        labels = [re.sub(r"<[^>]+>", "", r.split("</td>")[0]) for r in rows]
        assert sorted(labels) == ["attention", "random", "rollout", "saliency"]
        tokens = [spans(r) for r in rows]
        assert tokens[0][0] == "[CLS]" and tokens[0][-1] == "[SEP]"
        assert all(t == tokens[0] for t in tokens)

    # Provenance.
    assert document["provenance"]["model"]["weights_sha256"] in html
    assert document["provenance"]["dataset"]["fingerprint"] in html

    text = markdown.read_text()
    assert text.startswith("# attrib-bench: ")
    assert "## spearman vs saliency (aggregated rows)" in text
    assert (
        "| # | method | best (layer) | last layer | 95% CI | n | s/ex | peak MB | status |" in text
    )
    assert "### Per layer (spearman, aggregated rows, mean)" in text
    assert "## Top 5 tokens (last-layer aggregated rows)" in text
    assert f"**Example `{document['example_ids'][0]}`**" in text


def test_heatmaps_come_from_an_attributions_file_without_the_cache(tiny_bert, run_cli, tmp_path):
    output, attributions = tmp_path / "result.json", tmp_path / "attributions.jsonl"
    args = ("--model", tiny_bert, "--attributors", "attention,saliency", *RUN)
    code, _, err = run_cli("run", *args, "--output", output)
    assert code == 0, err
    assert "cache" not in json.loads(output.read_text())  # the suite runs without the cache

    code, _, err = run_cli("report", output, "--html", tmp_path / "bare.html")
    assert code == 0, err
    bare = (tmp_path / "bare.html").read_text()
    assert "No token-level attributions found" in bare and 'class="tok"' not in bare

    code, _, err = run_cli("attribute", *args, "--output", attributions)
    assert code == 0, err
    code, _, err = run_cli(
        "report", output, "--html", tmp_path / "r.html", "--attributions", attributions
    )
    assert code == 0, err
    html = (tmp_path / "r.html").read_text()
    records = [json.loads(line) for line in attributions.read_text().splitlines()]
    first = next(r for r in records if r["method"] == "saliency")
    section = html.index(f"Example <code>{first['id']}</code>")
    row = html[html.index("<code>saliency</code>", section) :].split("</tr>")[0]
    assert spans(row) == first["tokens"]
    # The deepest colour goes to the token with the largest score.
    weights = [float(w) for w in re.findall(r"rgba\(\d+,\d+,\d+,([\d.]+)\)", row)]
    scores = first["aggregated"][-1]
    assert int(np.argmax(weights)) == int(np.argmax(np.abs(scores)))


def test_markdown_goes_to_stdout_and_html_escapes_everything(result, run_cli):
    code, out, err = run_cli("report", result, "--examples", "1")
    assert code == 0, err
    assert out.startswith("# attrib-bench: ") and out.count("**Example `") == 1

    document = json.loads(result.read_text())
    document["methods"]["<img src=x onerror=alert(1)>"] = copy.deepcopy(
        document["methods"]["attention"]
    )
    html = render_html(document, examples=0)
    assert "<img src=x" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html


def test_report_usage_errors(run_cli, tmp_path, result):
    code, _, err = run_cli("report", tmp_path / "missing.json")
    assert code == 2 and "does not exist" in err
    code, _, err = run_cli("report", result, "--examples", "-1")
    assert code == 2 and "--examples must be at least 0" in err


def test_a_bare_or_unscored_result_is_a_usage_error_or_a_report(run_cli, tmp_path):
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"schema_version": 1, "methods": {}}))
    code, out, err = run_cli("report", bare)
    assert (code, out) == (2, "")
    assert err.strip().count("\n") == 0 and str(bare) in err and "'created'" in err

    # Without a display name the model's id titles the report; never "None on None/None".
    doc = check_document({"a": [0.5, 0.7, 0.6]})
    del doc["provenance"]["model"]["name"]
    doc["provenance"]["model"]["id"] = "org/model"
    for text in (render_markdown(doc), render_html(doc)):
        assert "attrib-bench: org/model on d/test" in text and "None" not in text.split("\n")[0]

    # Every method failed: the evaluator ran, nothing scored it; the report has no plot.
    doc["methods"]["a"].update(status="failed", error="RuntimeError: boom", scores={})
    assert "data:image/png" not in render_html(doc)


def styles(figure) -> list[tuple]:
    """(colour, marker, line style) of each legend entry: lines and whole-model hlines."""
    from matplotlib.colors import to_hex

    found = []
    for handle in figure.legends[0].legend_handles:
        if hasattr(handle, "get_marker"):
            found.append((to_hex(handle.get_color()), handle.get_marker(), handle.get_linestyle()))
        else:
            found.append((to_hex(handle.get_colors()[0]), None, str(handle.get_linestyle()[0])))
    return found


@pytest.mark.parametrize("count", [13, 45])
def test_every_method_has_its_own_colour_and_style_in_the_layer_plot(count):
    import matplotlib.pyplot as plt

    specs = [f"m{i}" for i in range(count)]
    doc = check_document({spec: [0.1 * i, 0.2, 0.3] for i, spec in enumerate(specs)})
    for i, spec in enumerate(specs):
        if i % 4:  # three of four methods layered, the others whole-model (one horizontal line)
            layer = {"std": 0.1, "ci95": [0, 1], "n": 3, "nan": 0}
            layers = [{**layer, "layer": k, "mean": 0.01 * i + k} for k in (1, 2)]
            doc["methods"][spec]["scores"]["spearman"]["aggregated"] = layers
    figure = layer_figure(doc, "spearman")
    found = styles(figure)
    plt.close(figure)
    assert len(found) == count and len(set(found)) == count
    if count <= 20:
        assert len({colour for colour, _, _ in found}) == count


def test_malformed_attributions_are_usage_errors(tmp_path):
    good = {"id": "ex0", "method": "a", "tokens": ["[CLS]", "hi"], "aggregated": [[0.5, None]]}
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps({"method": "b", "error": "boom"}) + "\n")
    assert read_attributions(path) == {
        "ex0": {"a": {"tokens": ["[CLS]", "hi"], "row": [0.5, None]}}
    }
    doc = check_document({"a": [0.5]}, ids=["ex0"])
    assert "`[CLS]` +0.5, `hi` -" in render_markdown(doc, read_attributions(path))
    for bad in (
        [1, 2],
        {**good, "tokens": "hi"},
        {**good, "aggregated": [["x", 0.1]]},
        {**good, "aggregated": [0.5]},
        {**good, "id": ["ex0"]},
        {key: value for key, value in good.items() if key != "method"},
    ):
        path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
        with pytest.raises(UsageError, match=r"^'.*a\.jsonl' line 2 is not an attributions record"):
            read_attributions(path)


def test_the_shipped_results_still_load_and_render():
    for name in ("evaluators_sst2", "globenc_sst2", "sst2_dev200"):
        doc = load_results(Path(__file__).parents[1] / "benchmarks" / "results" / f"{name}.json")
        assert render_markdown(doc).startswith("# attrib-bench: ")


@pytest.mark.skipif(
    CHROMIUM is None,
    reason="headless Chromium not installed (Debian: apt-get install chromium)",
)
def test_the_html_report_renders_in_headless_chromium(result, run_cli, tmp_path):
    import matplotlib.image

    page, shot = tmp_path / "report.html", tmp_path / "shot.png"
    code, _, err = run_cli("report", result, "--html", page)
    assert code == 0, err
    subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'chromium-profile'}",
            "--hide-scrollbars",
            "--window-size=1280,2000",
            f"--screenshot={shot}",
            page.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    rgb = matplotlib.image.imread(shot)[..., :3]
    colours = np.unique((rgb * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 100, "the screenshot is (nearly) one colour: nothing rendered"
    dark = (rgb.mean(axis=-1) < 0.3).mean()
    assert dark > 0.005, "no text rendered"
    red, green, blue = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    reddish = ((red - green > 0.15) & (red - blue > 0.15)).mean()
    assert reddish > 0.002, "no heatmap colours rendered"
