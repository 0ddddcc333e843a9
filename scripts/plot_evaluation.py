#!/usr/bin/env python3
"""Plots for docs/EVALUATION.md from the JSON lines under docs/eval/.

Reads every docs/eval/*.jsonl written by scripts/run_evaluation.sh (one `tinyserve eval --json`
object per line) and writes:
  docs/eval/quality_vs_budget.png      delta PPL, top-1 agreement, KL and attention-mass recall
                                       against budget, one line per policy, at the longest context
  docs/eval/quality_vs_budget_ctx.png  quest and streaming delta PPL / top-1 at every context
  docs/eval/step_time_vs_context.png   decode step and attention time, dense vs quest, per context
  docs/eval/page_size.png              quest quality against page size (budgets 512, 1024)
  docs/eval/passkey.png                passkey accuracy (depth x length) per policy and dense

Usage: .venv/bin/python scripts/plot_evaluation.py [eval_dir] [--tables]
  --tables  print the markdown tables of docs/EVALUATION.md instead of plotting
"""
import glob
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

_ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
EVAL_DIR = _ARGS[0] if _ARGS else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "docs", "eval")

POLICY_STYLE = {
    "quest": ("tab:blue", "o"),
    "oracle": ("black", "*"),
    "h2o": ("tab:green", "s"),
    "snapkv": ("tab:purple", "D"),
    "streaming": ("tab:orange", "^"),
    "random": ("tab:gray", "x"),
    "dense": ("tab:red", "v"),
}


def load():
    rows, passkey = [], []
    for path in sorted(glob.glob(os.path.join(EVAL_DIR, "*.jsonl"))):
        tag = os.path.basename(path)[:-len(".jsonl")]
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                r = json.loads(line)
                r["file"] = tag
                r["gqa"] = r.get("params", {}).get("gqa", "max")
                if "engine" in r:  # tinyserve bench rows (speed), not eval rows
                    continue
                if r.get("passkey") and r["gqa"] == "sum":
                    r["policy"] += "/sum"
                if r.get("passkey") and r.get("sink_pages", 0) > 0:
                    r["policy"] += "+sink"
                (passkey if r.get("passkey") else rows).append(r)
    return rows, passkey


def sel(rows, **kw):
    return [r for r in rows if all(r.get(k) == v for k, v in kw.items())]


def main_rows(rows):
    """Rows of the main grid: page 16, default quest aggregation, defaults for sinks/recent."""
    return [r for r in rows if r["page_size"] == 16 and r["gqa"] == "max"
            and r["sink_pages"] == 0 and r["recent_pages"] == 0 and r["dense_layers"] == 2
            and not r["file"].endswith("gqasum")]


def dedup(rows, key):
    seen = {}
    for r in rows:
        seen[key(r)] = r
    return list(seen.values())


def plot_quality(rows):
    m = main_rows(rows)
    if not m:
        return
    ctx = max(r["context"] for r in m)
    m = sel(m, context=ctx)
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    panels = [("delta_ppl_pct", "ΔPPL vs dense (%)", "symlog"),
              ("top1_agreement", "top-1 agreement with dense", "linear"),
              ("kl_mean", "KL(dense ‖ policy), nats/token", "log"),
              ("mass_recall", "attention-mass recall (oracle steps)", "linear")]
    for ax, (key, label, scale) in zip(axes.flat, panels):
        for pol, (color, marker) in POLICY_STYLE.items():
            pr = sorted(dedup(sel(m, policy=pol), lambda r: r["budget"]), key=lambda r: r["budget"])
            pr = [r for r in pr if r.get(key) is not None]
            if not pr:
                continue
            x = [r["budget"] for r in pr]
            y = [max(r[key], 1e-5) if scale == "log" else r[key] for r in pr]
            ax.plot(x, y, color=color, marker=marker, label=pol)
        # quest variants at this context: GQA sum and/or the first page always kept (--sink-pages 1)
        for (gqa, sink), ls in ((("sum", 0), "-."), (("max", 1), ":"), (("sum", 1), "--")):
            qs = sorted(dedup([r for r in rows if r["policy"] == "quest" and r["context"] == ctx
                               and r["page_size"] == 16 and r["gqa"] == gqa and r["sink_pages"] == sink],
                              lambda r: r["budget"]), key=lambda r: r["budget"])
            qs = [r for r in qs if r.get(key) is not None]
            if qs:
                ax.plot([r["budget"] for r in qs],
                        [max(r[key], 1e-5) if scale == "log" else r[key] for r in qs],
                        color="tab:blue", ls=ls, marker="o", mfc="white",
                        label=f"quest gqa={gqa}" + (" +sink page" if sink else ""))
        ax.set_xscale("log", base=2)
        budgets = sorted({r["budget"] for r in m})
        ax.set_xticks(budgets)
        ax.set_xticklabels([str(b) for b in budgets])
        if scale == "symlog":
            ax.set_yscale("symlog", linthresh=1)
            ax.axhline(1.0, color="tab:red", lw=0.8, ls="--", label="target ≤ 1 %")
            ax.axhline(0.0, color="k", lw=0.5)
            ax.set_ylim(bottom=-2)
        elif scale == "log":
            ax.set_yscale("log")
        if key == "top1_agreement":
            ax.axhline(0.95, color="tab:red", lw=0.8, ls="--", label="target ≥ 95 %")
        ax.set_xlabel("token budget")
        ax.set_title(label)
        ax.grid(True, which="both", alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    axes[0, 1].legend(fontsize=8, loc="lower right")
    et = m[0]["eval_tokens"]
    fig.suptitle(f"SmolLM2-135M-Instruct, alice29, context {ctx}, {et} teacher-forced tokens, page 16, "
                 f"2 dense layers")
    fig.tight_layout()
    fig.savefig(os.path.join(EVAL_DIR, "quality_vs_budget.png"), dpi=110)
    plt.close(fig)


def plot_quality_ctx(rows):
    m = main_rows(rows)
    ctxs = sorted({r["context"] for r in m})
    if len(ctxs) < 2:
        return
    fig, axes = plt.subplots(1, 4, figsize=(19, 4.5))
    cmap = plt.get_cmap("viridis")
    for i, ctx in enumerate(ctxs):
        color = cmap(i / max(1, len(ctxs) - 1))
        for pol, ls in (("quest", "-"), ("streaming", ":"), ("oracle", "--")):
            pr = sorted(dedup(sel(m, policy=pol, context=ctx), lambda r: r["budget"]),
                        key=lambda r: r["budget"])
            if not pr:
                continue
            x = [r["budget"] for r in pr]
            lab = f"{pol} {ctx}"
            axes[0].plot(x, [r["delta_ppl_pct"] for r in pr], ls=ls, marker="o", color=color, label=lab)
            axes[1].plot(x, [r["top1_agreement"] for r in pr], ls=ls, marker="o", color=color, label=lab)
            axes[2].plot(x, [max(r["kl_mean"], 1e-5) for r in pr], ls=ls, marker="o", color=color, label=lab)
            axes[3].plot(x, [r["mass_recall"] for r in pr], ls=ls, marker="o", color=color, label=lab)
    for ax, t in zip(axes, ["ΔPPL vs dense (%)", "top-1 agreement", "KL(dense ‖ policy), nats/token", "attention-mass recall"]):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("token budget")
        ax.set_title(t)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_yscale("symlog", linthresh=1)
    axes[0].set_ylim(bottom=-5)
    axes[2].set_yscale("log")
    budgets = sorted({r["budget"] for r in m})
    for ax in axes:
        ax.set_xticks(budgets)
        ax.set_xticklabels([str(b) for b in budgets])
    axes[3].legend(fontsize=7, ncol=2)
    fig.suptitle("quest (solid), oracle (dashed), streaming (dotted) by context, page 16")
    fig.tight_layout()
    fig.savefig(os.path.join(EVAL_DIR, "quality_vs_budget_ctx.png"), dpi=110)
    plt.close(fig)


def plot_step_time(rows):
    m = main_rows(rows)
    ctxs = sorted({r["context"] for r in m})
    if not ctxs:
        return
    bench = []
    for path in glob.glob(os.path.join(EVAL_DIR, "bench*.jsonl")):
        with open(path) as fh:
            bench += [json.loads(l) for l in fh if '"kind":"decode"' in l]
    fig, axes = plt.subplots(1, 3 if bench else 2, figsize=(18 if bench else 12, 4.5))
    dense_step = [np.median([r["step_ms_dense"] for r in sel(m, context=c)]) for c in ctxs]
    dense_attn = [np.median([r["attention_ms_dense"] for r in sel(m, context=c)]) for c in ctxs]
    axes[0].plot(ctxs, dense_step, "v-", color="tab:red", label="dense")
    axes[1].plot(ctxs, dense_attn, "v-", color="tab:red", label="dense")
    for b, color in ((512, "tab:cyan"), (1024, "tab:blue"), (2048, "navy")):
        pts = [(c, sel(m, context=c, policy="quest", budget=b)) for c in ctxs]
        pts = [(c, r[-1]) for c, r in pts if r]
        if not pts:
            continue
        axes[0].plot([c for c, _ in pts], [r["step_ms"] for _, r in pts], "o-", color=color,
                     label=f"quest B={b}")
        axes[1].plot([c for c, _ in pts], [r["attention_ms"] for _, r in pts], "o-", color=color,
                     label=f"quest B={b}")
    if bench:
        for pol, color in (("dense", "tab:red"), ("quest", "tab:blue")):
            for bsz, ls in ((1, "-"), (8, "--")):
                pts = sorted((r["context"], r["step_ms"]) for r in bench if r["policy"] == pol and r["batch"] == bsz)
                axes[2].plot([c for c, _ in pts], [v for _, v in pts], ls=ls, marker="o", color=color,
                             label=f"{pol}{' B=' + str(bench[0]['budget']) if pol == 'quest' else ''}, batch {bsz}")
        axes[2].set_title("tinyserve bench spot check, quiet machine (ms/step)")
    axes[0].set_title("eval: decode step (ms, median, batch 1, 1 thread)")
    axes[1].set_title("eval: attention incl. selection (ms/step)")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (tokens)")
        ax.set_xticks(ctxs)
        ax.set_xticklabels([str(c) for c in ctxs])
        ax.minorticks_off()
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_ylim(bottom=0)
    fig.suptitle("CPU, 1 thread. eval panels: loaded shared 2-vCPU machine, indicative only; see docs/PERFORMANCE.md")
    fig.tight_layout()
    fig.savefig(os.path.join(EVAL_DIR, "step_time_vs_context.png"), dpi=110)
    plt.close(fig)


def plot_page_size(rows):
    q = [r for r in rows if r["policy"] == "quest" and r["gqa"] == "max" and r["sink_pages"] == 0
         and r["recent_pages"] == 0 and not r["file"].endswith("gqasum")]
    sizes = sorted({r["page_size"] for r in q})
    if len(sizes) < 2:
        return
    # the context with the most page sizes
    ctx = max({r["context"] for r in q}, key=lambda c: (len({r["page_size"] for r in sel(q, context=c)}), c))
    q = sel(q, context=ctx)
    fig, axes = plt.subplots(1, 4, figsize=(16, 4))
    for b, color in ((512, "tab:cyan"), (1024, "tab:blue")):
        pts = []
        for s in sizes:
            r = sel(q, page_size=s, budget=b)
            if r:
                pts.append((s, r[-1]))
        if not pts:
            continue
        xs = [s for s, _ in pts]
        for ax, key in zip(axes, ["delta_ppl_pct", "top1_agreement", "mass_recall", "kv_bytes_ratio"]):
            ax.plot(xs, [r[key] for _, r in pts], "o-", color=color, label=f"B={b}")
    for ax, t in zip(axes, ["ΔPPL (%)", "top-1 agreement", "attention-mass recall", "KV bytes read / dense"]):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes)
        ax.set_xticklabels([str(s) for s in sizes])
        ax.set_xlabel("page size (tokens)")
        ax.set_title(t)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"quest, page size sweep, context {ctx}")
    fig.tight_layout()
    fig.savefig(os.path.join(EVAL_DIR, "page_size.png"), dpi=110)
    plt.close(fig)


def plot_passkey(pk):
    if not pk:
        return
    # nominal length from the file name passkey_L<N>.jsonl, else the reported token count
    for r in pk:
        tag = r["file"]
        r["nominal"] = int(tag.split("_L")[1].split("_")[0]) if "_L" in tag else r["length"]
    lengths = sorted({r["nominal"] for r in pk})
    depths = sorted({round(r["depth"], 3) for r in pk})
    names = {r["policy"] for r in pk}
    pols = [p for p in POLICY_STYLE if p in names] + sorted(names - set(POLICY_STYLE))
    pols.sort(key=lambda p: (0 if p.startswith("quest") else 1, p))
    budgets = sorted({r["budget"] for r in pk})
    ncol = len(pols) + 1
    fig, axes = plt.subplots(len(budgets), ncol, figsize=(2.5 * ncol + 1, 3.6 * len(budgets)),
                             squeeze=False)
    for bi, b in enumerate(budgets):
        for ax, pol in zip(axes[bi], ["dense"] + pols):
            grid = np.full((len(depths), len(lengths)), np.nan)
            for r in pk:
                if pol != "dense" and (r["policy"], r["budget"]) != (pol, b):
                    continue
                i, j = depths.index(round(r["depth"], 3)), lengths.index(r["nominal"])
                grid[i, j] = r["accuracy_dense"] if pol == "dense" else r["accuracy"]
            im = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto", origin="upper")
            for i in range(len(depths)):
                for j in range(len(lengths)):
                    if not np.isnan(grid[i, j]):
                        ax.text(j, i, f"{grid[i, j]:.1f}", ha="center", va="center", fontsize=7)
            ax.set_xticks(range(len(lengths)))
            ax.set_xticklabels([str(x) for x in lengths], fontsize=8)
            ax.set_yticks(range(len(depths)))
            ax.set_yticklabels([f"{d:.2f}" for d in depths] if pol == "dense" else [], fontsize=8)
            if bi == len(budgets) - 1:
                ax.set_xlabel("prompt length")
            if pol == "dense":
                ax.set_ylabel("needle depth")
            ax.set_title("dense" if pol == "dense" else f"{pol} B={b}", fontsize=9)
    fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.6, label="exact-match accuracy")
    n = int(max(r["samples"] for r in pk))
    fig.suptitle(f"passkey retrieval, SmolLM2-135M-Instruct, up to {n} samples per cell")
    fig.savefig(os.path.join(EVAL_DIR, "passkey.png"), dpi=110, bbox_inches="tight")
    plt.close(fig)


def fmt(v, nd=3):
    return "–" if v is None else f"{v:.{nd}f}"


def tables(rows, pk):
    """Markdown tables for docs/EVALUATION.md."""
    out = []
    m = main_rows(rows)
    for ctx in sorted({r["context"] for r in m}, reverse=True):
        rs = dedup(sel(m, context=ctx), lambda r: (r["policy"], r["budget"]))
        order = list(POLICY_STYLE)
        rs.sort(key=lambda r: (order.index(r["policy"]), r["budget"]))
        d = rs[0]
        out.append(f"\n#### context {ctx} (+{d['eval_tokens']} evaluated), page 16: dense PPL {d['ppl_dense']:.3f}, "
                   f"dense step {d['step_ms_dense']:.1f} ms (attention {d['attention_ms_dense']:.1f} ms)\n")
        out.append("| policy | budget | PPL | ΔPPL % | top-1 | KL | page hit | mass recall | reuse | KV read / dense "
                   "| step ms | attn ms | select ms |")
        out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in rs:
            out.append(f"| {r['policy']} | {r['budget']} | {r['ppl']:.3f} | {r['delta_ppl_pct']:+.2f} | "
                       f"{r['top1_agreement']:.3f} | {r['kl_mean']:.4f} | {fmt(r['page_hit_rate'])} | "
                       f"{fmt(r['mass_recall'])} | {fmt(r['reuse'])} | {r['kv_bytes_ratio']:.3f} | "
                       f"{r['step_ms']:.1f} | {r['attention_ms']:.1f} | {r['select_cpu_ms']:.1f} |")
    q = [r for r in rows if r["policy"] == "quest"]
    var = [r for r in q if r["page_size"] != 16 or r["gqa"] != "max" or r["sink_pages"] != 0]
    if var:
        keys = {(r["context"], r["budget"]) for r in var}
        base = [r for r in q if r["page_size"] == 16 and r["gqa"] == "max" and r["sink_pages"] == 0
                and (r["context"], r["budget"]) in keys]
        out.append("\n#### quest variants (page size, GQA aggregation, sink page)\n")
        out.append("| context | page | gqa | sink pages | budget | ΔPPL % | top-1 | KL | page hit | mass recall | reuse | KV read / dense |")
        out.append("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in sorted(var + base, key=lambda r: (r["context"], r["budget"], r["sink_pages"], r["gqa"], r["page_size"])):
            out.append(f"| {r['context']} | {r['page_size']} | {r['gqa']} | {r['sink_pages']} | {r['budget']} | {r['delta_ppl_pct']:+.2f} | "
                       f"{r['top1_agreement']:.3f} | {r['kl_mean']:.4f} | {fmt(r['page_hit_rate'])} | "
                       f"{fmt(r['mass_recall'])} | {fmt(r['reuse'])} | {r['kv_bytes_ratio']:.3f} |")
    oth = [r for r in rows if r["policy"] != "quest" and r["page_size"] != 16]
    if oth:
        out.append("\n#### other policies at other page sizes\n")
        out.append("| context | page | policy | budget | ΔPPL % | top-1 | KL | page hit | mass recall | KV read / dense |")
        out.append("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in sorted(oth, key=lambda r: (r["context"], r["policy"], r["budget"], r["page_size"])):
            out.append(f"| {r['context']} | {r['page_size']} | {r['policy']} | {r['budget']} | {r['delta_ppl_pct']:+.2f} | "
                       f"{r['top1_agreement']:.3f} | {r['kl_mean']:.4f} | {fmt(r['page_hit_rate'])} | "
                       f"{fmt(r['mass_recall'])} | {r['kv_bytes_ratio']:.3f} |")
    if pk:
        for r in pk:
            tag = r["file"]
            r["nominal"] = int(tag.split("_L")[1].split("_")[0]) if "_L" in tag else r["length"]
        lengths = sorted({r["nominal"] for r in pk})
        out.append("\n#### passkey: accuracy averaged over the depths run (samples per depth in brackets)\n")
        out.append("| policy | budget | " + " | ".join(str(L) for L in lengths) + " |")
        out.append("|---|---:|" + "---:|" * len(lengths))
        order = list(POLICY_STYLE)
        series = [("dense", 0)] + sorted({(r["policy"], r["budget"]) for r in pk},
                                         key=lambda x: (order.index(x[0].split("+")[0].split("/")[0]), x[0], x[1]))
        for pol, b in series:
            cells = []
            for L in lengths:
                rs = [r for r in pk if r["nominal"] == L and (pol == "dense" or (r["policy"], r["budget"]) == (pol, b))]
                if pol == "dense":
                    rs = dedup(rs, lambda r: r["depth"])
                if not rs:
                    cells.append("–")
                    continue
                key = "accuracy_dense" if pol == "dense" else "accuracy"
                acc = sum(r[key] * r["samples"] for r in rs) / sum(r["samples"] for r in rs)
                cells.append(f"{acc:.2f} ({len(rs)}×{rs[0]['samples']})")
            out.append(f"| {pol} | {b if pol != 'dense' else '–'} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main():
    rows, pk = load()
    if "--tables" in sys.argv:
        print(tables(rows, pk))
        return
    plot_quality(rows)
    plot_quality_ctx(rows)
    plot_step_time(rows)
    plot_page_size(rows)
    plot_passkey(pk)
    print(f"{len(rows)} eval rows, {len(pk)} passkey rows; plots in {os.path.abspath(EVAL_DIR)}")


if __name__ == "__main__":
    main()
