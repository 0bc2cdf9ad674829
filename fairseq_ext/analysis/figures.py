"""How the analyses draw: figures sized for the HTML report, their titles and captions (ending
with the note of what made them, :class:`FigureContext`), each model's colour in every figure,
and the grid of heatmap panels on one colour scale (:func:`map_figure`)."""
import collections
import dataclasses
import math
import os
import re
import textwrap
import zlib
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq_ext.analysis import AnalysisError
from fairseq_ext.common import checkpoints, data_text

# the HTML report shows a figure at most about 1100 px wide, and save_figure writes 120 dpi: a
# figure this wide is shown 1:1, so a label of f points is 1.67 f pixels on screen
FIGURE_WIDTH = 9.1
# the smallest label size a figure uses (10 px on screen at FIGURE_WIDTH)
MIN_FONT_SIZE = 6.0


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def integer_ticks(axis) -> None:
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def layer_axes(ax, xlabel: str, ylabel: str, legend: Optional[float] = None) -> None:
    """Whole-number layer ticks, both labels and the legend (font size ``legend``)."""
    ax.set(xlabel=xlabel, ylabel=ylabel)
    integer_ticks(ax.xaxis)
    ax.legend(**({} if legend is None else {"fontsize": legend}))


# matplotlib's ten default colours, then ten more: a model keeps its colour in every figure of a
# report (each analysis runs as its own process, so the colour depends on the name alone).
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
           "#000080", "#808000", "#008080", "#800000", "#ff1493", "#4b0082", "#556b2f", "#b8860b", "#00ced1", "#696969")
# the project's systems (the CPU benchmark's rows) take the palette's colours in this order
KNOWN_SYSTEMS = ("baseline", "m-00", "ms-1-plus-aif", "mma", "baseline-no-pos", "mma-no-pos", "m-10", "iter-c-agg",
                 "transparent", "ms-1", "enc-dc", "m-10-plus-ms-1-plus-aif")
ALIASES = {"transformer": "baseline", "base": "baseline", "dc": "enc-dc"}


def colour_key(name: str) -> str:
    """``name`` as :data:`KNOWN_SYSTEMS` spells it: "MS-1+AIF" -> "ms-1-plus-aif", "Transformer" -> "baseline"."""
    key = re.sub(r"[^a-z0-9]+", "-", name.lower().replace("+", " plus ")).strip("-")
    key = re.sub(r"(^|-)nopos$", r"\1no-pos", key)
    return ALIASES.get(key, key)


def system_colours(names: Sequence[str]) -> Dict[str, str]:
    """A known system's fixed colour, any other name the one its CRC-32 picks (or, taken in this
    figure, the next free one, names in sorted order)."""
    known = {n: PALETTE[KNOWN_SYSTEMS.index(colour_key(n)) % len(PALETTE)]
             for n in names if colour_key(n) in KNOWN_SYSTEMS}
    taken, out = set(known.values()), dict(known)
    for name in sorted(n for n in dict.fromkeys(names) if n not in known):
        start = zlib.crc32(colour_key(name).encode("utf-8"))
        free = [PALETTE[(start + k) % len(PALETTE)] for k in range(len(PALETTE))]
        out[name] = next((c for c in free if c not in taken), free[0])
        taken.add(out[name])
    return {n: out[n] for n in names}


def legend_outside(ax, fontsize: float = 8.0, **kwargs):
    return ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=fontsize, **kwargs)


def wilson_interval(successes: int, n: int, z: float = 1.959964) -> Tuple[float, float]:
    """The Wilson score interval of ``successes`` of ``n`` (95% for the default z)."""
    if n <= 0:
        raise ValueError(f"a proportion over {n} items has no interval")
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def label_points(ax, xs, ys, labels, colour=None, fontsize: float = 8.0, above: bool = True) -> None:
    """``labels`` above (or below) the points, clear of the markers."""
    for x, y, text in zip(xs, ys, labels):
        if text:
            ax.annotate(text, (x, y), xytext=(0, 7 if above else -7), textcoords="offset points", ha="center",
                        va="bottom" if above else "top", fontsize=fontsize, color=colour)


def flavour_of(rows: Sequence[dict]) -> str:
    return next((r["flavour"] for r in rows if r.get("flavour")), "sacreBLEU")


def marks_note(marks: str = "thesis") -> str:
    from fairseq_ext.tools.statistics import MARKS

    return ", ".join(f"{mark} p < {bound:g}" for bound, mark in MARKS[marks])


def names_for(checkpoints: Sequence[str], names: Optional[Sequence[str]]) -> List[str]:
    """``names`` (--names), else each checkpoint's directory name (numbered where two share one)."""
    if names:
        if len(names) != len(checkpoints):
            raise AnalysisError(f"--names: {len(names)} names for {len(checkpoints)} checkpoints")
        return list(names)
    out = [os.path.basename(os.path.dirname(os.path.abspath(c))) or os.path.basename(c) for c in checkpoints]
    return out if len(set(out)) == len(out) else [f"{n}-{i}" for i, n in enumerate(out, 1)]


def file_stem(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "model"


def data_description(data: Optional[str], split: Optional[str]) -> str:
    """"wmt14.en-de, test": the data directory's name and the split."""
    name = os.path.basename(os.path.normpath(os.path.abspath(data))) if data else ""
    return ", ".join(p for p in (name, split) if p)


def wrap_text(text: str, width_inches: float = FIGURE_WIDTH, fontsize: float = 8.0) -> str:
    """``text`` broken into lines that fit ``width_inches`` at ``fontsize`` points, per paragraph."""
    # an average character of matplotlib's default font is about half the font size wide
    columns = max(20, int(width_inches * 72 / (0.52 * fontsize)))
    return "\n".join(textwrap.fill(p, columns, break_on_hyphens=False) if p else "" for p in text.split("\n"))


def add_caption(fig, text: str, fontsize: float = 8.0, width: Optional[float] = None) -> None:
    """A caption below the axes, wrapped to the figure's width (or ``width`` inches)."""
    caption = fig.text(0.0, 0.0, wrap_text(text, width or fig.get_figwidth(), fontsize), ha="left", va="top",
                       fontsize=fontsize, transform=fig.transFigure, gid="caption")
    caption.unwrapped = (text, width or fig.get_figwidth())  # what save_figure adds the context's note to


def add_title(fig, text: str, fontsize: float = 11.0) -> None:
    """The title above everything tight_layout arranges, so that it never covers the panels'
    titles (save_figure's bbox_inches="tight" takes in what lies above the top)."""
    fig.text(0.5, 1.0, text, ha="center", va="bottom", fontsize=fontsize, transform=fig.transFigure)


@dataclasses.dataclass(frozen=True)
class FigureContext:
    """What a command's figures were made from, as its arguments say; ``data_text`` names what was
    analysed where it is not the split of --data. Every caption ends with its :meth:`note`, so
    that a figure copied elsewhere keeps its scale."""

    checkpoint: object = None  # one path, or a list of them
    names: object = None
    data: Optional[str] = None
    split: Optional[str] = None
    generate_args: Optional[str] = None
    flavour: Optional[str] = None
    max_sentences: Optional[int] = None
    data_text: Optional[str] = None

    @classmethod
    def of(cls, args, data_text: Optional[str] = None) -> "FigureContext":
        fields = [f.name for f in dataclasses.fields(cls) if f.name != "data_text"]
        return cls(**{k: getattr(args, k, None) for k in fields}, data_text=data_text)

    def note(self) -> str:
        """The models (name: size, updates), the data, the decoding and the BLEU flavour; "" without checkpoints."""
        if not self.checkpoint:
            return ""
        paths = [self.checkpoint] if isinstance(self.checkpoint, str) else list(self.checkpoint)
        names = names_for(paths, [self.names] if isinstance(self.names, str) else self.names)
        models = []
        for path, name in zip(paths, names):
            try:
                models.append(f"{name} ({checkpoints.summary(path)})")
            except Exception:  # noqa: BLE001 (a note on a figure never stops the analysis)
                models.append(name)
        parts = [("Model: " if len(models) == 1 else "Models: ") + "; ".join(models)]
        if self.data_text:
            parts.append(f"data: {self.data_text}")
        elif self.data:
            parts.append(f"data: {self._where()}")
        if self.generate_args:
            parts.append(f"decoding: {self.generate_args}")
        if self.flavour:
            parts.append(f"BLEU {self.flavour}")
        return ". ".join(parts) + "."

    def _where(self) -> str:
        env = data_text.read_prep_env(str(self.data))
        where = data_description(str(self.data), self.split)
        if env.get("test_set") and self.split == "test":
            total = int(env["test_pairs"]) if env.get("test_pairs", "").isdigit() else None
            limit = self.max_sentences
            if total and isinstance(limit, int) and 0 < limit < total:
                where += f" ({env['test_set']}, {limit:,} of its {total:,} sentences)"
            else:
                where += f" ({env['test_set']}" + (f", {total:,} sentences" if total else "") + ")"
        return where


def save_figure(fig, path: str, context: Optional[FigureContext] = None):
    """Write ``fig`` as PNG, its caption followed by the note of ``context``; returns ``fig``."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    try:
        note = context.note() if context is not None else ""
    except Exception:  # noqa: BLE001 (a note on a figure never stops the analysis)
        note = ""
    if note:
        caption = next((t for t in fig.texts if t.get_gid() == "caption"), None)
        if caption is None:
            add_caption(fig, note)
        elif note not in caption.get_text().replace("\n", " "):
            text, width = caption.unwrapped
            caption.set_text(wrap_text(text + " " + note, width, caption.get_fontsize()))
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    pyplot().close(fig)
    return fig


# A heatmap grid's panels share one grid of token cells, as many side by side as keep the token
# labels at LEGIBLE_FONT or more; longer sentences get fewer panels a row.

LABEL_FONT = 9.0  # the token labels' largest size, points
LEGIBLE_FONT = 6.5  # the smallest label size a layout chooses more panels a row for (11 px on screen)
CELL_LIMIT = 16.0  # the largest token cell, points (short sentences do not draw huge squares)
COLOURBAR = 0.9  # inches at the right for the colour bar and its label
MAX_COLUMNS = 4


# one heatmap: ``matrix`` (rows x columns, numpy), its column and row token labels
Panel = collections.namedtuple("Panel", "title matrix xlabels ylabels")


def _label_inches(labels, font: float) -> float:
    return max([len(l) for l in labels] + [1]) * 0.6 * font / 72 + 0.2


def grid_layout(panels: List[Panel]) -> dict:
    """Columns, rows, label font and token cell (points): the most columns (at most MAX_COLUMNS)
    whose labels stay at LEGIBLE_FONT or more, else one (labels down to MIN_FONT_SIZE)."""
    n_x = max(len(p.xlabels) for p in panels)
    ylabels = [l for p in panels for l in p.ylabels]

    def fit(cols):
        font = LABEL_FONT
        for _ in range(3):  # the y labels' width depends on the font, the font on the room left
            room = FIGURE_WIDTH - COLOURBAR - _label_inches(ylabels, font) - 0.25 * (cols - 1)
            cell = min(CELL_LIMIT, room * 72 / (cols * n_x))
            font = min(LABEL_FONT, cell / 1.2)  # a label's line is 1.2 of its size
        return {"cols": cols, "font": font, "cell": cell}

    fits = [fit(c) for c in range(min(len(panels), MAX_COLUMNS), 0, -1)]
    choice = next((f for f in fits if f["font"] >= LEGIBLE_FONT), fits[-1])
    rows = -(-len(panels) // choice["cols"])
    choice = fit(-(-len(panels) // rows))  # balanced: 4 panels at 3 a row become 2 x 2
    choice["font"] = max(MIN_FONT_SIZE, choice["font"])
    choice["rows"] = rows
    return choice


def map_figure(panels: List[Panel], title: str, caption: str, vmax: float = 1.0, xlabel: str = "", ylabel: str = "",
               quantity: str = "attention weight"):
    """The panels on one colour scale (0 to ``vmax``, a colour bar of ``quantity``), laid out by :func:`grid_layout`."""
    layout = grid_layout(panels)
    cols, rows, font, cell = layout["cols"], layout["rows"], layout["font"], layout["cell"]
    n_x = max(len(p.xlabels) for p in panels)
    n_y = max(len(p.ylabels) for p in panels)
    x_room = _label_inches([l for p in panels for l in p.xlabels], font) + 0.1  # rotated labels
    panel_h = n_y * cell / 72
    height = rows * (panel_h + x_room + 0.3) + 0.5  # each row: its titles; the bottom: the axis label
    width = (_label_inches([l for p in panels for l in p.ylabels], font) + 0.35 + cols * n_x * cell / 72
             + 0.25 * (cols - 1) + COLOURBAR)
    fig = pyplot().figure(figsize=(min(FIGURE_WIDTH, width), height))
    grid = fig.add_gridspec(rows, cols + 1, width_ratios=[n_x * cell / 72] * cols + [0.15])
    image = None
    for k, panel in enumerate(panels):
        ax = fig.add_subplot(grid[k // cols, k % cols])
        image = ax.imshow(panel.matrix, cmap="Blues", vmin=0.0, vmax=vmax, aspect="equal", interpolation="nearest")
        ax.set_title(panel.title, fontsize=font + 1)
        ax.set_xticks(range(len(panel.xlabels)), panel.xlabels, rotation=90, fontsize=font)
        first = k % cols == 0
        ax.set_yticks(range(len(panel.ylabels)), panel.ylabels if first else [], fontsize=font)
        if first and ylabel:
            ax.set_ylabel(ylabel, fontsize=font + 1)
        if xlabel and k + cols >= len(panels):
            ax.set_xlabel(xlabel, fontsize=font + 1)
    bar = fig.colorbar(image, cax=fig.add_subplot(grid[:, -1]))
    bar.set_label(f"{quantity} (one scale, 0 to {vmax:.2g})", fontsize=9)
    bar.ax.tick_params(labelsize=8)
    add_title(fig, title)
    # a narrow figure's caption may run wider than its panels rather than be a tall column
    add_caption(fig, caption, width=max(fig.get_figwidth(), 6.5))
    return fig
