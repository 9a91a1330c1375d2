"""``attrib-bench report`` on a similarity result (layer heatmaps beside the random-init floor,
diagonal tables) and the "Across models" section of a run over several models."""

from __future__ import annotations

import copy
import json
import re
import shutil
from html.parser import HTMLParser

import pytest
import torch

from attrib_bench.api import report
from attrib_bench.core.errors import UsageError
from attrib_bench.reports.html import render_html, render_similarity_html
from attrib_bench.reports.markdown import render_markdown
from attrib_bench.reports.similarity import render_similarity_markdown


class Heatmaps(HTMLParser):
    """Every ``table.sim`` of a page: (measure, kind, x, y) -> rows of (text, value, null)."""

    def __init__(self):
        super().__init__()
        self.tables: dict[tuple, list[list[tuple]]] = {}
        self.current = None
        self.cell = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table" and "sim" in (attrs.get("class") or "").split():
            key = (attrs["data-measure"], attrs["data-kind"], attrs["data-x"], attrs["data-y"])
            self.current = self.tables.setdefault(key, [])
        elif tag == "tr" and self.current is not None:
            self.current.append([])
        elif tag == "td" and self.current is not None:
            value = attrs.get("data-value")
            null = attrs.get("class") == "null"
            self.cell = [" ", None if value is None else float(value), null]

    def handle_data(self, data):
        if self.cell is not None:
            self.cell[0] += data

    def handle_endtag(self, tag):
        if tag == "td" and self.cell is not None:
            self.current[-1].append((self.cell[0].strip(), self.cell[1], self.cell[2]))
            self.cell = None
        elif tag == "table":
            if self.current is not None:
                self.current[:] = [row for row in self.current if row]
            self.current = None


def heatmaps(page: str) -> dict[tuple, list[list[tuple]]]:
    parser = Heatmaps()
    parser.feed(page)
    return parser.tables


def assert_heatmap(cells, matrix):
    assert len(cells) == len(matrix)
    for row, expected in zip(cells, matrix, strict=True):
        assert len(row) == len(expected)
        for (text, value, null), want in zip(row, expected, strict=True):
            if want is None:
                assert null and text == "n/a" and value is None
            else:
                assert not null and text == f"{want:.3f}"
                assert value == pytest.approx(want, abs=1e-12)


def _matrix(seed: float, rows: int = 3, columns: int = 3, null=()):
    return [
        [None if (i, j) in null else round(seed + 0.1 * i - 0.03 * j, 6) for j in range(columns)]
        for i in range(rows)
    ]


def hand_made() -> dict:
    """Models a (2 layers) and b <two>&, x's floor and the random pair, b's floor (beside none)."""
    measures = ("linear_cka", "procrustes", "linear_mse")

    def pair(x, y, kind, seed):
        return {
            "x": x,
            "y": y,
            "kind": kind,
            "measures": {
                m: _matrix(seed + k / 10, null={(0, 2)} if m == "linear_mse" else ())
                for k, m in enumerate(measures)
            },
        }

    ra0, ra1, rb0 = "random-init:a@seed0", "random-init:a@seed1", "random-init:b@seed0"
    return {
        "schema": "attrib-bench/similarity",
        "version": 1,
        "config": {"models": ["a", "b<two>&"], "token_level": False},
        "dataset": {"name": "d", "split": "test", "sentences": 8, "rows": 8},
        "gram_subsample": None,
        "models": [
            {"name": "a", "id": "a", "model_type": "bert", "layers": 2, "width": 4},
            {"name": "b<two>&", "id": "b", "model_type": "bert", "layers": 2, "width": 4},
        ],
        "pairs": [
            pair("a", "b<two>&", "models", 0.2),
            pair("a", ra0, "random-floor", 0.5),
            pair(ra0, ra1, "random-random", 0.6),
            pair("b<two>&", rb0, "random-floor", 0.4),
            pair(rb0, "random-init:b@seed1", "random-random", 0.3),
        ],
    }


def test_hand_made_similarity_html_and_markdown():
    document = hand_made()
    page = render_similarity_html(document)
    assert "<script" not in page and "http" not in page and "b&lt;two&gt;&amp;" in page
    assert "<two>" not in page
    tables = heatmaps(page)
    assert len(tables) == 5 * 3  # every pair (b's floor too), every measure
    for pair in document["pairs"]:
        for name, matrix in pair["measures"].items():
            assert_heatmap(tables[(name, pair["kind"], pair["x"], pair["y"])], matrix)
    # The floor and the random pair sit beside the models pair, in every measure's block.
    section = page[page.index("<h2>a vs b") :]
    block = section[section.index("<h3>procrustes") : section.index("<h3>linear_mse")]
    kinds = re.findall(r'data-kind="([^"]+)"', block)
    assert kinds == ["models", "random-floor", "random-random"]
    assert "lower is more similar" in block and "0 = embeddings" in block
    cka = section[section.index("<h3>linear_cka") : section.index("<h3>procrustes")]
    assert "higher is more similar" in cka
    assert "lower is more similar" in section[section.index("<h3>linear_mse") :]

    text = render_similarity_markdown(document)
    assert "procrustes ↓" in text and "linear_cka ↑" in text and "linear_mse ↓" in text
    models, floor = document["pairs"][0]["measures"], document["pairs"][1]["measures"]
    for i in range(3):
        expected = []
        for name in models:
            here, below = models[name][i][i], floor[name][i][i]
            expected.append(f"{'-' if here is None else f'{here:.3f}'} ({below:.3f})")
        assert f"| {i} | " + " | ".join(expected) + " |" in text


@pytest.fixture
def similarity_file(tiny_bert, run_cli, tmp_path):
    output = tmp_path / "s.json"
    args = ("--dataset", "default", "--limit", "12", "--no-learned", "--quiet")
    code, _, err = run_cli(
        "similarity", "--models", f"{tiny_bert},{tiny_bert}", *args, "--output", output
    )
    assert code == 0, err
    return output


def test_report_of_a_real_similarity_file(similarity_file, run_cli, tmp_path):
    page_path, markdown_path = tmp_path / "out" / "s.html", tmp_path / "s.md"
    code, _, err = run_cli(
        "report", similarity_file, "--html", page_path, "--markdown", markdown_path
    )
    assert code == 0, err
    document = json.loads(similarity_file.read_text())
    tables = heatmaps(page_path.read_text())
    models, floor, both = document["pairs"]
    nulls = 0
    for pair in (models, floor, both):
        for name, matrix in pair["measures"].items():
            assert_heatmap(tables[(name, pair["kind"], pair["x"], pair["y"])], matrix)
            nulls += sum(v is None for row in matrix for v in row)
    assert nulls  # pwcca on 12 sentences of 32 features is undefined: marked, not dropped

    text = markdown_path.read_text()
    assert text == report(similarity_file)
    rows = [line for line in text.splitlines() if re.match(r"\| \d+ \|", line)]
    depth = len(models["measures"]["linear_cka"])
    assert len(rows) == 2 * depth  # the models pair (floor in brackets), the random pair
    names = list(models["measures"])
    for i in range(depth):
        cells = [c.strip() for c in rows[i].strip("|").split("|")][1:]
        for name, cell in zip(names, cells, strict=True):
            here, below = re.fullmatch(r"(\S+) \((\S+)\)", cell).groups()
            for shown, pair in ((here, models), (below, floor)):
                value = pair["measures"][name][i][i]
                assert shown == ("-" if value is None else f"{value:.3f}")

    code, _, err = run_cli("report", similarity_file, "--attributions", tmp_path / "a.jsonl")
    assert code == 2 and "similarity result" in err


def test_neither_a_run_nor_a_similarity_result_is_one_line_exit_2(run_cli, tmp_path):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"schema": "something/else", "pairs": []}))
    code, out, err = run_cli("report", other, "--html", tmp_path / "x.html")
    assert (code, out) == (2, "") and err.strip().count("\n") == 0
    assert "neither an attrib-bench run result" in err and str(other) in err
    assert not (tmp_path / "x.html").exists()

    broken = hand_made()
    broken["pairs"][1]["measures"]["procrustes"][0][0] = "x"
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(broken))
    code, out, err = run_cli("report", path)
    assert code == 2 and err.strip().count("\n") == 0
    assert "pairs[1].measures['procrustes']" in err
    with pytest.raises(UsageError, match="neither"):
        report({"schema": "x"})


@pytest.fixture
def multi_model_result(tiny_bert, run_cli, tmp_path):
    """A real run over the tiny BERT and a copy of it with perturbed weights."""
    from transformers import AutoModelForSequenceClassification

    other = tmp_path / "other"
    shutil.copytree(tiny_bert, other)
    model = AutoModelForSequenceClassification.from_pretrained(other)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    model.save_pretrained(other)
    output = tmp_path / "r.json"
    code, _, err = run_cli(
        "run",
        "--models",
        f"{tiny_bert},{other}",
        "--limit",
        "6",
        "--attributors",
        "saliency,attention",
        "--quiet",
        "--output",
        output,
    )
    assert code == 0, err
    return output


def _tables_after(page: str, heading: str) -> str:
    start = page.index(heading)
    return page[start : page.index("</table>", start)]


def _numbers(fragment: str) -> list[float]:
    return [float(x) for x in re.findall(r'<td class="num">([+-]\d+\.\d+)</td>', fragment)]


def test_across_models_in_the_run_reports(multi_model_result):
    document = json.loads(multi_model_result.read_text())
    section = document["models"]
    ranking = section["ranking"]
    page, text = render_html(document), render_markdown(document)
    assert "<h2>Across models</h2>" in page and "## Across models" in text
    tau = ranking["kendall_tau"]
    shown = _numbers(_tables_after(page, "Kendall tau between"))
    assert shown == pytest.approx([v for row in tau for v in row], abs=5e-4)
    for i, row in enumerate(tau, 1):
        cells = " | ".join(f"{v:+.3f}" for v in row)
        assert re.search(rf"\| {i}: [^|]+ \| " + re.escape(cells) + " \\|", text)
    mean, low = f"{ranking['mean']:+.3f}", f"{ranking['min']:+.3f}"
    assert f"Kendall tau mean {mean}, min {low}" in text
    assert f"Kendall tau mean {mean}, min {low}" in page
    per_model = _tables_after(page, f"{ranking['evaluator']} per model")
    for spec in ranking["methods"]:
        row = per_model[per_model.index(f"<code>{spec}</code>") :].split("</tr>")[0]
        values = [entry["last_layer"][spec][ranking["evaluator"]] for entry in section["per_model"]]
        assert _numbers(row) == pytest.approx(values, abs=5e-4)
        cells = " | ".join(f"{v:+.3f}" for v in values)
        assert f"| `{spec}` | {cells} |" in text
    # Without the section (a single-model run) neither report has it.
    single = copy.deepcopy(document)
    del single["models"]
    assert "Across models" not in render_html(single) + render_markdown(single)
    # A section without a ranking says so instead of failing.
    single["models"] = dict(section, ranking=None)
    assert "No method ranking across models" in render_markdown(single)
