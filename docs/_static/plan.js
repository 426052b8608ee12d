// The "Plan your model" page (docs/plan.md): the series' planner, `python -m helpers.plan`,
// run in the browser. Pyodide (CPython compiled to WebAssembly) and a zip of the planner's
// own modules are served with the site (.ci/plan_page.py writes them into planner/; this
// script's data-assets attribute, set by docs/conf.py, says where that is from the page).
// The page calls helpers.planning.plan.main(argv), the command line's own entry point, with
// the flags the form sets, and shows what it prints: the table, the JSON (drawn as a
// figure here), or its one-line refusal. Nothing is fetched from another host.
(() => {
  "use strict";
  const script = document.currentScript;
  const ASSETS = new URL(script.dataset.assets, document.baseURI);
  const ZH = (document.documentElement.lang || "").toLowerCase().startsWith("zh");
  const PASTE = "config.json"; // the pasted text is saved as this file, and --config names it
  const JSON_PATH = "/tmp/plan.json";

  const TEXT = {
    en: {
      loading: "Loading Python (Pyodide) and the planner…",
      ready: (s, v) => `Python ${v} (Pyodide) and the planner loaded in ${s} s, in this page.`,
      failed: "The planner could not start in this browser:",
      model: "Model",
      paste: "config.json (paste it below)",
      configText: "A Hugging Face config.json",
      hardware: "Hardware",
      gpus: "GPUs",
      gpusHint: "product of the degrees",
      layout: "Layout (Plan; Search tries every layout itself)",
      dp: "dp (data)",
      tp: "tp (tensor)",
      pp: "pp (pipeline)",
      cp: "cp (context)",
      ep: "ep (expert)",
      zero: "ZeRO stage",
      keep: "ZeRO-3 keeps the gathered weights",
      remat: "Recompute (remat)",
      precision: "Precision",
      batch: "Batch",
      seq: "Sequence length",
      micro: "Micro-batch (sequences per dp rank)",
      global: "Global batch (sequences per step)",
      globalHint: "from the layout",
      marginHint: "calibrated",
      margin: "Margin on gradients + activations",
      more: "More flags (see --help)",
      moreHint: "e.g. --grad-dtype fp32 --tp-overlap --top 5",
      plan: "Plan this layout",
      search: "Search the layouts of these GPUs",
      running: "Planning…",
      command: "The same in a shell",
      savedAs: "(the pasted text saved as config.json)",
      figure: "Memory per device and MFU",
      table: "The command's table",
      json: "JSON",
      copy: "Copy",
      copied: "Copied",
      memAxis: "GB on the fullest device",
      mfuAxis: "MFU",
      hbm: (name, gb) => `HBM of ${name}: ${gb} GB`,
      marginKey: (m) => `margin (×${m} on gradients + activations)`,
      parts: {
        params: "parameters",
        grads: "gradients",
        optimizer: "optimizer",
        gathered: "gathered weights",
        activations: "activations",
      },
      bound: "optimistic MFU",
      expected: "expected MFU (± its error)",
      values: "optimistic / expected",
      verdict: { fits: "fits", tight: "tight", "out of memory": "out of memory" },
      figNote: (n) =>
        n > 1
          ? `The ${n} layouts the search ranked, best first, drawn from the JSON below.`
          : "Drawn from the JSON below.",
    },
    zh: {
      loading: "正在加载 Python（Pyodide）和规划器……",
      ready: (s, v) => `Python ${v}（Pyodide）和规划器已在本页中加载，用时 ${s} 秒。`,
      failed: "规划器无法在这个浏览器中启动：",
      model: "模型",
      paste: "config.json（粘贴在下方）",
      configText: "Hugging Face 的 config.json",
      hardware: "硬件",
      gpus: "GPU 数",
      gpusHint: "各并行度之积",
      layout: "布局（供“规划这个布局”使用；搜索时会自行尝试每种布局）",
      dp: "dp（数据）",
      tp: "tp（张量）",
      pp: "pp（流水线）",
      cp: "cp（上下文）",
      ep: "ep（专家）",
      zero: "ZeRO 阶段",
      keep: "ZeRO-3 保留收集来的权重",
      remat: "remat（重计算）",
      precision: "精度",
      batch: "批次",
      seq: "序列长度",
      micro: "微批次（每个 dp rank 的序列数）",
      global: "全局批次（每步的序列数）",
      globalHint: "由布局决定",
      marginHint: "已校准",
      margin: "梯度 + 激活值的余量",
      more: "更多选项（见 --help）",
      moreHint: "例如 --grad-dtype fp32 --tp-overlap --top 5",
      plan: "规划这个布局",
      search: "搜索这些 GPU 的所有布局",
      running: "规划中……",
      command: "在终端里运行同样的规划",
      savedAs: "（粘贴的文本存为 config.json）",
      figure: "每设备显存与 MFU",
      table: "命令行打印的表格",
      json: "JSON",
      copy: "复制",
      copied: "已复制",
      memAxis: "最满的设备上的占用（GB）",
      mfuAxis: "MFU",
      hbm: (name, gb) => `${name} 的 HBM：${gb} GB`,
      marginKey: (m) => `余量（(梯度 + 激活值) ×${m}）`,
      parts: {
        params: "参数",
        grads: "梯度",
        optimizer: "优化器状态",
        gathered: "收集来的权重",
        activations: "激活值",
      },
      bound: "乐观 MFU",
      expected: "预期 MFU（± 其误差）",
      values: "乐观 / 预期",
      verdict: { fits: "放得下", tight: "偏紧", "out of memory": "显存不足" },
      figNote: (n) =>
        n > 1 ? `搜索排出的 ${n} 种布局，最好的在上，按下面的 JSON 绘制。` : "按下面的 JSON 绘制。",
    },
  }[ZH ? "zh" : "en"];

  const root = document.getElementById("planner");
  if (!root) return;
  let py = null;
  let runs = 0;

  // --- the form -----------------------------------------------------------------------

  const el = (tag, attrs = {}, ...children) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (k === "text") e.textContent = v;
      else if (v !== undefined && v !== null && v !== false) e.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children) if (c) e.append(c);
    return e;
  };

  // Each control carries the flag it sets (data-flag) and the command line's default
  // (data-default): a control left at its default adds nothing to the command.
  function field(label, control, hint) {
    return el("label", { class: "planner-field" }, el("span", { text: label }), control, hint);
  }
  const number = (flag, def, placeholder) =>
    el("input", {
      type: "text",
      inputmode: "decimal",
      "data-flag": flag,
      "data-default": def,
      value: def,
      placeholder: placeholder || "",
      size: 8,
    });
  function select(flag, def, options) {
    const s = el("select", { "data-flag": flag, "data-default": def });
    for (const [value, text] of options) s.append(el("option", { value, text }));
    s.value = def;
    return s;
  }

  function buildForm(info) {
    const models = select(
      "--config",
      info.models[0],
      [...info.models.map((m) => [m, m]), [PASTE, TEXT.paste]],
    );
    const config = el("textarea", {
      "data-flag": "config-text",
      rows: 8,
      spellcheck: "false",
      placeholder: '{"model_type": "llama", "hidden_size": 4096, ...}',
    });
    const configField = field(TEXT.configText, config);
    configField.classList.add("planner-wide");
    const showConfig = () => (configField.hidden = models.value !== PASTE);
    models.addEventListener("change", showConfig);
    const hardware = select(
      "--hardware",
      "h100",
      Object.entries(info.hardware).map(([k, h]) => [k, `${h.name} (${h.hbm_gb} GB)`]),
    );
    const zero = select("--zero", "0", ["0", "1", "2", "3"].map((z) => [z, z]));
    const keep = el("input", { type: "checkbox", "data-flag": "--keep-gathered" });
    const remat = select("--remat", "none", info.remats.map((r) => [r, r]));
    const precision = select("--precision", "mixed", info.precisions.map((p) => [p, p]));
    const more = el("input", {
      type: "text",
      "data-flag": "more",
      placeholder: TEXT.moreHint,
      spellcheck: "false",
    });
    const planButton = el("button", { type: "button", class: "planner-run", "data-mode": "plan",
                                      text: TEXT.plan });
    const searchButton = el("button", { type: "button", class: "planner-run",
                                        "data-mode": "search", text: TEXT.search });
    const fieldset = (legend, ...fields) =>
      el("fieldset", {}, el("legend", { text: legend }), ...fields);
    const form = el(
      "form",
      { class: "planner-form", autocomplete: "off" },
      fieldset(
        `${TEXT.model} · ${TEXT.hardware}`,
        field(TEXT.model, models),
        field(TEXT.hardware, hardware),
        field(TEXT.gpus, number("--gpus", "", TEXT.gpusHint)),
        configField,
      ),
      fieldset(
        TEXT.layout,
        ...["dp", "tp", "pp", "cp", "ep"].map((a) => field(TEXT[a], number(`--${a}`, "1"))),
        field(TEXT.zero, zero),
        field(TEXT.remat, remat),
        field(TEXT.precision, precision),
        el("label", { class: "planner-field planner-check" }, keep, el("span", { text: TEXT.keep })),
      ),
      fieldset(
        TEXT.batch,
        field(TEXT.seq, number("--seq", "4096")),
        field(TEXT.micro, number("--micro-batch", "1")),
        field(TEXT.global, number("--global-batch", "", TEXT.globalHint)),
        field(TEXT.margin, number("--margin", "", TEXT.marginHint)),
        el("label", { class: "planner-field planner-wide" }, el("span", { text: TEXT.more }), more),
      ),
      el("div", { class: "planner-buttons" }, planButton, searchButton),
    );
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      run("plan");
    });
    for (const b of [planButton, searchButton]) {
      b.addEventListener("click", () => run(b.dataset.mode));
    }
    showConfig();
    return form;
  }

  const control = (flag) => root.querySelector(`[data-flag="${CSS.escape(flag)}"]`);

  // The command line the form stands for: --config and --hardware always, every other
  // control only where it differs from the command's default. A search lays out the GPUs
  // itself, so it takes no layout flags.
  function argv(mode) {
    const args = ["--config", control("--config").value, "--hardware", control("--hardware").value];
    const layout = ["--dp", "--tp", "--pp", "--cp", "--ep", "--zero", "--remat", "--precision",
                    "--micro-batch"];
    const flags = mode === "search"
      ? ["--gpus", "--seq", "--global-batch", "--margin"]
      : ["--gpus", ...layout, "--seq", "--global-batch", "--margin"];
    for (const flag of flags) {
      const value = control(flag).value.trim();
      if (value !== control(flag).dataset.default) args.push(flag, value);
    }
    if (mode === "search") args.push("--search");
    else if (control("--keep-gathered").checked) args.push("--keep-gathered");
    const more = control("more").value.trim();
    if (more) args.push(...more.split(/\s+/));
    return args;
  }

  // --- running the planner --------------------------------------------------------------

  const GLUE = `
import contextlib, io, json, os, sys
sys.path.insert(0, "/planner")
from helpers.planning import plan as _plan, search as _search
from helpers.planning.activations import REMATS
from helpers.planning.estimate import ACTIVATION_MARGIN
from helpers.planning.hardware import HARDWARE
from helpers.planning.layout import PRECISIONS
from helpers.planning.models import NAMED_MODELS

# The page prints a search's table, then asks the same command for its JSON: the second
# call gets the first one's result instead of searching again.
_search_layouts, _last = _search.search_layouts, {}
def _search_once(*args, **kwargs):
    key = repr((args, sorted(kwargs.items())))
    if key not in _last:
        _last.clear()
        _last[key] = _search_layouts(*args, **kwargs)
    return _last[key]
_search.search_layouts = _search_once

def planner_info():
    return json.dumps({
        "models": list(NAMED_MODELS), "remats": list(REMATS), "precisions": list(PRECISIONS),
        "margin": ACTIVATION_MARGIN, "python": sys.version.split()[0],
        "hardware": {k: {"name": h.name, "hbm_gb": round(h.hbm_bytes / 1e9, 1)}
                     for k, h in HARDWARE.items()},
    })

def planner_run(argv, config):
    """python -m helpers.plan ARGV: its exit code, what it printed, and the JSON it wrote."""
    if config is not None:
        with open("${PASTE}", "w") as f:
            f.write(config)
    if os.path.exists("${JSON_PATH}"):
        os.remove("${JSON_PATH}")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = _plan.main(list(argv))
        except SystemExit as exit:
            code = exit.code
    written = open("${JSON_PATH}").read() if os.path.exists("${JSON_PATH}") else None
    return json.dumps({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue(),
                       "json": written})
`;

  function call(args, config) {
    const fn = py.globals.get("planner_run");
    const list = py.toPy(args);
    try {
      return JSON.parse(fn(list, config)); // undefined is None (null would be jsnull)
    } finally {
      list.destroy();
      fn.destroy();
    }
  }

  async function run(mode) {
    if (!py || root.dataset.busy) return; // one run at a time
    const args = argv(mode);
    const config = control("--config").value === PASTE ? control("config-text").value : undefined;
    const status = root.querySelector(".planner-status");
    status.textContent = TEXT.running;
    root.dataset.busy = "true";
    await new Promise((r) => setTimeout(r, 0)); // let the status show before Python runs
    let result;
    try {
      // A plan prints its table and writes its JSON in one run. A search prints one or
      // writes the other, so the command runs twice: the table (its search, timed), then
      // the JSON (the same search's result: see _search_once).
      if (mode === "search") {
        result = call(args, config);
        if (result.code === 0) result.json = call([...args, "--json", JSON_PATH], config).json;
      } else {
        result = call([...args, "--json", JSON_PATH], config);
      }
    } catch (err) {
      result = { code: 1, stdout: "", stderr: String(err), json: null };
      console.error(err);
    }
    show(mode, args, config !== undefined, result);
    status.textContent = root.dataset.readyText;
    delete root.dataset.busy;
    runs += 1;
    root.dataset.runs = String(runs);
    history.replaceState(null, "", `#${encodeHash(args)}`);
  }

  // --- what it printed ----------------------------------------------------------------

  const quote = (a) => (/^[\w@%+=:,./-]+$/.test(a) ? a : `'${a.replace(/'/g, "'\\''")}'`);

  function show(mode, args, pasted, result) {
    const out = root.querySelector(".planner-output");
    out.replaceChildren();
    out.dataset.argv = JSON.stringify(args);
    out.dataset.mode = mode;
    out.dataset.code = String(result.code);
    const command = `python -m helpers.plan ${args.map(quote).join(" ")}`;
    out.append(
      el("p", { class: "planner-heading", text: TEXT.command }),
      el("pre", { class: "planner-command" },
         el("code", { text: command + (pasted ? `    # ${TEXT.savedAs}` : "") })),
    );
    if (result.code !== 0) {
      // The command's refusal: one line on stderr (exit code 2).
      const line = result.stderr.trim().split("\n").pop() || `exit code ${result.code}`;
      out.append(el("p", { class: "planner-error", role: "alert", text: line }));
      return;
    }
    let data = null;
    if (result.json) {
      data = JSON.parse(result.json);
      const plans = Array.isArray(data) ? data : [data];
      const drawn = figure(plans);
      out.append(el("p", { class: "planner-heading", text: TEXT.figure }),
                 drawn, el("p", { class: "planner-note", text: TEXT.figNote(plans.length) }));
      // The layout above guessed the labels' widths; now that the browser has set the text,
      // fit the figure to what it drew.
      const box = drawn.getBBox();
      drawn.setAttribute("viewBox", `${box.x - 2} ${box.y - 2} ${box.width + 4} ${box.height + 4}`);
      drawn.setAttribute("width", Math.ceil(box.width + 4));
    }
    out.append(el("p", { class: "planner-heading", text: TEXT.table }),
               el("pre", { class: "planner-table", text: result.stdout.replace(/\n$/, "") }));
    if (result.json) {
      const copy = el("button", { type: "button", class: "planner-copy", text: TEXT.copy });
      const pre = el("pre", { class: "planner-json", text: result.json.replace(/\n$/, "") });
      copy.addEventListener("click", async () => {
        try {
          await navigator.clipboard.writeText(result.json);
        } catch {
          const range = document.createRange();
          range.selectNodeContents(pre);
          getSelection().removeAllRanges();
          getSelection().addRange(range);
          document.execCommand("copy");
        }
        copy.textContent = TEXT.copied;
        setTimeout(() => (copy.textContent = TEXT.copy), 1500);
      });
      out.append(el("details", { class: "planner-json-box" },
                    el("summary", {}, el("span", { text: TEXT.json }), copy), pre));
    }
  }

  // --- the figure, drawn from the JSON ---------------------------------------------------

  const SVG = "http://www.w3.org/2000/svg";
  const svg = (tag, attrs = {}, text) => {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  };
  const COLORS = {
    params: "#4c72b0",
    grads: "#dd8452",
    optimizer: "#55a868",
    gathered: "#8172b3",
    activations: "#c44e52",
  };
  const pct = (x) => `${(100 * x).toFixed(1)}%`;

  function layoutLabel(p) {
    const deg = Object.entries(p.degrees).filter(([, d]) => d > 1).map(([a, d]) => `${a}${d}`);
    if (p.options.virtual_stages > 1) deg.push(`v${p.options.virtual_stages}`);
    const zero = `ZeRO-${p.zero}${p.options.keep_gathered ? "k" : ""}`;
    return `${deg.join(" ") || "1 device"} · ${zero} · mb${p.micro_batch} · ${p.remat}`;
  }

  function niceStep(max, ticks) {
    const raw = max / ticks;
    const mag = 10 ** Math.floor(Math.log10(raw));
    return [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw);
  }

  // Roughly how wide a label is at 13 px: CJK characters are about twice a Latin one.
  const textWidth = (t) => [...t].reduce((w, c) => w + (c.charCodeAt(0) > 0x2e80 ? 13 : 7.2), 0);

  // One row per plan (a search's ranked layouts, best first): on the left the bytes on the
  // fullest device, part by part, then the margin's room (hatched), against the HBM line;
  // the verdict; on the right the optimistic MFU (light) and the expected MFU (dark) with its
  // leave-one-out error (the whisker), then both values. Every number is the JSON's.
  function figure(plans) {
    const rowH = 30;
    const h = rowH - 10;
    const labelW = Math.max(120, ...plans.map((p) => textWidth(layoutLabel(p))));
    const mem = { x: labelW + 16, w: 300 };
    const verdictX = mem.x + mem.w + 8;
    const verdicts = plans.map((p) => TEXT.verdict[p.memory_verdict] || p.memory_verdict);
    const verdictW = Math.max(...verdicts.map(textWidth));
    const mfu = { x: verdictX + verdictW + 24, w: 160 };
    const valuesX = mfu.x + mfu.w + 10;
    const W = valuesX + Math.max(textWidth("100.0% / 100.0%"), textWidth(TEXT.values)) + 4;
    const top = 84;
    const bottom = top + plans.length * rowH;
    const H = bottom + 24;
    const s = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: W, class: "planner-figure",
                           role: "img", "font-size": 13,
                           "font-family": "system-ui, -apple-system, 'Segoe UI', sans-serif",
                           "data-plans": plans.length });
    const text = (x, y, t, attrs = {}) => s.append(svg("text", { x, y, ...attrs }, t));
    const line = (x1, y1, x2, y2, attrs) => s.append(svg("line", { x1, y1, x2, y2, ...attrs }));
    const rect = (x, y, width, height, attrs) =>
      s.appendChild(svg("rect", { x, y, width: Math.max(0, width), height, ...attrs }));

    const defs = svg("defs");
    const hatch = svg("pattern", { id: "planner-hatch", width: 6, height: 6,
                                   patternUnits: "userSpaceOnUse",
                                   patternTransform: "rotate(45)" });
    hatch.append(svg("rect", { width: 6, height: 6, fill: "#fff" }),
                 svg("line", { x1: 0, y1: 0, x2: 0, y2: 6, stroke: "#999", "stroke-width": 2 }));
    defs.append(hatch);
    s.append(defs);

    const need = (p) =>
      p.per_device_bytes.total +
      (p.margin - 1) * (p.per_device_bytes.grads + p.per_device_bytes.activations);
    const hbm = plans[0].hbm_bytes;
    const memMax = Math.max(hbm, ...plans.map(need)) * 1.04;
    const mx = (b) => mem.x + (mem.w * b) / memMax;
    const mfuMax = Math.max(1, ...plans.map((p) => p.mfu * 1.04));
    const fx = (m) => mfu.x + (mfu.w * m) / mfuMax;

    // The legend, two lines.
    let x = 0;
    const key = (y, fill, label, attrs = {}) => {
      rect(x, y, 12, 12, { fill, ...attrs });
      text(x + 16, y + 11, label);
      x += 30 + textWidth(label);
    };
    for (const part of Object.keys(COLORS)) key(4, COLORS[part], TEXT.parts[part]);
    x = 0;
    const margins = plans.map((p) => p.margin);
    const [mLo, mHi] = [Math.min(...margins), Math.max(...margins)];
    key(24, "url(#planner-hatch)", TEXT.marginKey(mLo === mHi ? mLo : `${mLo}–${mHi}`),
        { stroke: "#888" });
    line(x, 30, x + 14, 30, { stroke: "#b00020", "stroke-width": 2, "stroke-dasharray": "4 2" });
    x += 18;
    text(x, 35, TEXT.hbm(plans[0].hardware, +(hbm / 1e9).toFixed(1)), { fill: "#b00020" });
    x += 30 + textWidth(TEXT.hbm(plans[0].hardware, +(hbm / 1e9).toFixed(1)));
    key(24, "#b8c7e0", TEXT.bound);
    key(24, "#2a4d8f", TEXT.expected);

    // Titles and grid.
    text(mem.x, top - 12, TEXT.memAxis, { "font-weight": 600 });
    text(mfu.x, top - 12, TEXT.mfuAxis, { "font-weight": 600 });
    text(valuesX, top - 12, TEXT.values, { "font-weight": 600 });
    const memStep = niceStep(memMax / 1e9, 5);
    for (let g = 0; g * memStep * 1e9 <= memMax; g += 1) {
      const gx = mx(g * memStep * 1e9);
      line(gx, top - 4, gx, bottom, { stroke: "#e3e3e3" });
      text(gx, bottom + 16, String(+(g * memStep).toFixed(1)),
           { "text-anchor": "middle", fill: "#555" });
    }
    for (const m of [0, 0.25, 0.5, 0.75, 1]) {
      line(fx(m), top - 4, fx(m), bottom, { stroke: "#e3e3e3" });
      text(fx(m), bottom + 16, `${100 * m}%`, { "text-anchor": "middle", fill: "#555" });
    }

    plans.forEach((p, i) => {
      const y = top + i * rowH + 5;
      const baseline = y + h - 5;
      text(labelW, baseline, layoutLabel(p), { "text-anchor": "end" });
      let at = 0;
      for (const part of Object.keys(COLORS)) {
        const b = p.per_device_bytes[part];
        if (!(b > 0)) continue;
        const r = rect(mx(at), y, mx(at + b) - mx(at), h, { fill: COLORS[part] });
        r.append(svg("title", {}, `${TEXT.parts[part]}: ${(b / 1e9).toFixed(2)} GB`));
        at += b;
      }
      const room = need(p) - at;
      if (room > 0) rect(mx(at), y, mx(at + room) - mx(at), h,
                         { fill: "url(#planner-hatch)", stroke: "#888" });
      text(verdictX, baseline, verdicts[i],
           { fill: p.memory_verdict === "fits" ? "#1b6e20" : "#b00020" });
      rect(fx(0), y, fx(p.mfu) - fx(0), h, { fill: "#b8c7e0" });
      const expected = p.mfu_expected;
      if (expected !== null && expected !== undefined) {
        rect(fx(0), y + 4, fx(expected) - fx(0), h - 8, { fill: "#2a4d8f" });
        const err = p.mfu_error || 0;
        line(fx(expected * (1 - err)), y + h / 2, fx(expected * (1 + err)), y + h / 2,
             { stroke: "#111", "stroke-width": 1.5 });
      }
      text(valuesX, baseline,
           expected === null || expected === undefined
             ? pct(p.mfu)
             : `${pct(p.mfu)} / ${pct(expected)}`);
    });
    const hx = mx(hbm);
    line(hx, top - 4, hx, bottom, { stroke: "#b00020", "stroke-width": 2,
                                     "stroke-dasharray": "5 3" });
    return s;
  }

  // --- the address: a plan's flags in the URL, so that a plan can be linked ---------------

  function encodeHash(args) {
    return args.map(encodeURIComponent).join("&");
  }

  // The first plan: the address's, else the README's example (LLaMA-3-8B, FSDP on 8 H100s).
  const FIRST_PLAN = ["--config", "llama3-8b", "--hardware", "h100", "--dp", "8", "--zero", "3"];

  function applyHash() {
    const raw = location.hash.replace(/^#/, "");
    const args = raw ? raw.split("&").map(decodeURIComponent).filter(Boolean) : FIRST_PLAN;
    let mode = "plan";
    const more = [];
    for (let i = 0; i < args.length; i += 1) {
      const flag = args[i];
      const c = control(flag);
      if (flag === "--search") mode = "search";
      else if (flag === "--keep-gathered") control(flag).checked = true;
      else if (c && c.tagName === "SELECT" && ![...c.options].some((o) => o.value === args[i + 1])) {
        more.push(flag, args[i + 1]);
        i += 1;
      } else if (c && i + 1 < args.length) {
        c.value = args[i + 1];
        i += 1;
      } else more.push(flag);
    }
    control("more").value = more.join(" ");
    control("--config").dispatchEvent(new Event("change"));
    return mode;
  }

  // --- start --------------------------------------------------------------------------

  async function start() {
    const status = el("p", { class: "planner-status", text: TEXT.loading });
    root.append(status);
    try {
      const zip = fetch(new URL("helpers.zip", ASSETS)).then((r) => {
        if (!r.ok) throw new Error(`helpers.zip: ${r.status}`);
        return r.arrayBuffer();
      });
      const { loadPyodide } = await import(new URL("pyodide/pyodide.mjs", ASSETS).href);
      py = await loadPyodide({ indexURL: new URL("pyodide/", ASSETS).href });
      const loaded = performance.now();
      py.unpackArchive(await zip, "zip", { extractDir: "/planner" });
      py.runPython(GLUE);
      const imported = performance.now();
      const info = JSON.parse(py.globals.get("planner_info")());
      root.insertBefore(buildForm(info), status);
      root.append(el("div", { class: "planner-output", "aria-live": "polite" }));
      const mode = applyHash();
      const seconds = (performance.now() / 1000).toFixed(1);
      root.dataset.readyText = TEXT.ready(seconds, info.python);
      await run(mode);
      // Milliseconds since the page was requested: Pyodide started, the planner imported,
      // the first plan shown (tests/test_browser.py reads them).
      root.dataset.timings = JSON.stringify([loaded, imported, performance.now()].map(Math.round));
      root.dataset.readyMs = String(Math.round(performance.now()));
    } catch (err) {
      console.error(err);
      status.textContent = `${TEXT.failed} ${err}`;
      status.classList.add("planner-error");
      root.dataset.failed = String(err);
    }
  }

  start();
})();
