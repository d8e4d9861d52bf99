// sparsemm search page: an include box, a "but not" box, an image grid with concept chips,
// and a side panel explaining a result (matched concepts, excluded concepts checked).
// Plain DOM code, no build step; every piece of data is inserted as text, never as HTML.
"use strict";

(() => {
  const PAGE_SIZE = 24;
  const $ = (id) => document.getElementById(id);
  const form = $("search-form");
  const includeBox = $("include");
  const excludeBox = $("exclude");
  const strategySelect = $("strategy");
  const advancedBox = $("advanced");
  const minScoreSelect = $("min-score");
  const results = $("results");
  const statusLine = $("status");
  const errorLine = $("error");
  const moreButton = $("more");
  const panel = $("panel");
  const panelBody = $("panel-body");
  const uploadInput = $("upload");
  const likeBar = $("like-bar");

  // request: the last successful search request; query: the server's parsed query.
  const state = {
    request: null,
    query: null,
    nextOffset: null,
    seq: 0,
    explained: null,
    filterThreshold: 0.1,
    conceptFloor: 0,
    strategies: [],
    defaultStrategy: "",
    // "more like this": null, {kind: "item", id, item} or {kind: "image", file, url}
    like: null,
  };

  /** Build an element: attributes (class, dataset, on<event>, others verbatim) + children. */
  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs)) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "dataset") Object.assign(node.dataset, value);
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  /** fetch JSON; a non-2xx answer throws with the server's {"error": message}. */
  async function api(path, options = {}) {
    const headers = { accept: "application/json", ...(options.headers || {}) };
    if (options.body && !headers["content-type"]) headers["content-type"] = "application/json";
    const response = await fetch(path, { ...options, headers });
    let data = null;
    try {
      data = await response.json();
    } catch (_) {
      data = null;
    }
    if (!response.ok) {
      throw new Error((data && data.error) || `${response.status} ${response.statusText}`);
    }
    return data;
  }

  const splitTerms = (text) => text.split(/[,;]/).map((t) => t.trim()).filter(Boolean);
  const quoted = (terms) => terms.map((t) => `“${t}”`).join(", ");

  /** "images like item d1" / "images like your picture" while a like-search is on. */
  function likeText() {
    if (!state.like) return null;
    return state.like.kind === "item" ? `items like ${state.like.id}` : "items like your picture";
  }

  function describe(query) {
    const found = query.include.length ? quoted(query.include) : likeText() || "anything";
    return query.exclude.length ? `${found} but not ${quoted(query.exclude)}` : found;
  }

  function showError(message) {
    errorLine.textContent = message || "";
    errorLine.hidden = !message;
  }

  function conceptLabel(concept) {
    return concept.words.length ? concept.words.slice(0, 2).join(" · ") : `dim ${concept.dim}`;
  }

  /** A concept's term for the "but not" box: its top word (none: it cannot be typed). */
  const conceptTerm = (concept) => (concept.words.length ? concept.words[0] : null);

  // "dogs" and "dog" are one term; a chip's word is searched when any include term holds it
  const stem = (w) => (w.length > 3 && w.endsWith("s") && !w.endsWith("ss") ? w.slice(0, -1) : w);
  const wordsOf = (text) => (text.toLowerCase().match(/[\p{L}\p{N}-]+/gu) || []).map(stem);

  function isSearched(term) {
    if (!term) return true;
    if (state.query === null) return false;
    const words = wordsOf(term);
    return state.query.include.some((inc) => {
      const have = new Set(wordsOf(inc));
      return words.length > 0 && words.every((w) => have.has(w));
    });
  }

  /** Add a term to the "but not" box (once) and search again. */
  function addExclusion(term) {
    const terms = splitTerms(excludeBox.value);
    if (!terms.some((t) => t.toLowerCase() === term.toLowerCase())) terms.push(term);
    excludeBox.value = terms.join(", ");
    runSearch(false);
  }

  // A concept is shown as a chip when it carries at least this share of the strongest one
  // (and, with codes that are probabilities, at least the server's concept floor): the
  // long tail of faint classes ("wig", "bassoon" on a portrait) is noise to a reader.
  const CHIP_SHARE = 0.25;
  const MAX_CHIPS = 4;

  /** The concepts worth showing, strongest first. */
  function shownConcepts(concepts, floor = 0, most = MAX_CHIPS) {
    const top = Math.max(0, ...concepts.map((c) => c.weight));
    return concepts
      .filter((c) => c.weight > 0 && c.weight >= CHIP_SHARE * top && c.weight >= floor)
      .slice(0, most);
  }

  /** A clickable concept chip: click leaves the concept out. Query concepts are inert. */
  function chip(concept) {
    const term = conceptTerm(concept);
    const searched = isSearched(term);
    if (searched) {
      // part of what was searched: shown, never offered as an exclusion
      return el(
        "span",
        {
          class: "chip chip-query",
          title: `dim ${concept.dim}: part of what you searched for`,
          dataset: { dim: String(concept.dim), term: term || "" },
        },
        conceptLabel(concept),
      );
    }
    const title = searched
      ? `dim ${concept.dim}: part of what you searched for`
      : `leave out “${term}” (dim ${concept.dim}, weight ${concept.weight.toFixed(3)})`;
    return el(
      "button",
      {
        type: "button",
        class: searched ? "chip chip-query" : "chip",
        title,
        disabled: searched,
        dataset: { dim: String(concept.dim), term: term || "" },
        onclick: (event) => {
          event.stopPropagation();
          addExclusion(term);
        },
      },
      conceptLabel(concept),
    );
  }

  /** A score as people read it: a match probability in whole percent, rounded down as the
   * ranking does ("92% match"), or three significant digits ("17.9", "0.482"). */
  function formatScore(score, probabilistic) {
    if (probabilistic) {
      const n = Math.floor(100 * score + 1e-7);
      return n < 1 ? "<1% match" : `${n}% match`;
    }
    const a = Math.abs(score);
    return score.toFixed(a >= 100 ? 0 : a >= 10 ? 1 : a >= 1 ? 2 : 3);
  }

  /** A name with a line-break opportunity after each "/" ("holiday/day1/IMG_1234.jpg"
   * wraps at the folders, not one character a line). */
  function breakable(text) {
    return text.split(/(?<=\/)/).flatMap((part, i) => (i ? [el("wbr"), part] : [part]));
  }

  function thumbnail(item, size, full = false) {
    if (item.image) {
      return el("img", {
        src: !full && item.thumb ? item.thumb : item.image,
        alt: item.caption || item.id,
        loading: "lazy",
        width: size,
        height: size,
      });
    }
    return el("div", { class: "caption-card" }, el("span", {}, item.caption || item.id));
  }

  function renderHit(hit, probabilistic) {
    const bad = hit.violations || [];
    return el(
      "figure",
      { class: bad.length ? "card violates" : "card", dataset: { id: hit.id } },
      el(
        "button",
        {
          type: "button",
          class: "thumb",
          title: "Why this result?",
          onclick: () => explain(hit.id),
        },
        thumbnail(hit, 256),
      ),
      el(
        "figcaption",
        {},
        el("span", { class: "caption", title: hit.id }, breakable(hit.caption || hit.id)),
        el(
          "span",
          {
            class: "score",
            title: probabilistic
              ? `rank ${hit.rank}: the probability that it shows what you asked for is ${hit.score.toFixed(3)}`
              : `rank ${hit.rank}, score ${hit.score} (higher is better)`,
          },
          `#${hit.rank} · ${formatScore(hit.score, probabilistic)}`,
        ),
      ),
      (hit.also || []).length
        ? el("div", { class: "also", title: "the same photo (same bytes, or a link) at other paths" },
            `also: ${hit.also.join(", ")}`)
        : null,
      bad.length
        ? el("div", { class: "violation", title: "it shows a term you left out (its labels name it, or the scorer finds it likely)" },
            `✗ has ${bad.join(", ")}`)
        : null,
      el("div", { class: "chips", "aria-label": "matched concepts" }, shownConcepts(hit.matched).map(chip)),
      evidenceLine(hit.evidence || []),
      el(
        "div",
        { class: "card-actions" },
        el(
          "button",
          {
            type: "button",
            class: "like-button",
            title: "find items like this one (keeps your “but not” terms)",
            onclick: (event) => {
              event.stopPropagation();
              likeItem(hit);
            },
          },
          "more like this",
        ),
      ),
    );
  }

  /** Start a "more like this" search on a result (or on an uploaded picture). */
  function setLike(like) {
    state.like = like;
    likeBar.hidden = !like;
    if (!like) {
      uploadInput.value = "";
      return;
    }
    includeBox.value = "";
    // the page's CSP allows no blob: images, so an upload is named, not previewed
    const picture = like.kind === "item" ? like.item : null;
    $("like-label").replaceChildren(
      picture && picture.image ? el("img", { src: picture.thumb || picture.image, alt: "" }) : "",
      " More like ",
      el("strong", {}, like.kind === "item" ? `item ${like.id}` : `your picture ${like.file.name}`),
      " — type what to leave out in “but not”",
    );
  }

  function likeItem(hit) {
    setLike({ kind: "item", id: hit.id, item: hit });
    runSearch(false);
  }

  /** A term's value as the CLI prints it (TermEvidence.text): a probability in whole
   * percent ("dog 93%", "cat 0% (left out)": the chance the item shows a cat, which was left
   * out), a code similarity with two decimals; a picture's similarity reads "like it 48%". */
  function evidenceText(e) {
    const n = Math.floor(100 * e.value + 1e-7);
    const value = e.kind === "code similarity"
      ? e.value.toFixed(2)
      : `${n < 1 && e.value > 0 ? "<1" : n}%`;
    const term = e.term.startsWith("like: ") ? "like it" : e.term;
    return `${term} ${value}${e.side === "exclude" ? " (left out)" : ""}`;
  }

  /** "dog 93% · cat 2% (left out)": how strongly the item carries each query term. */
  function evidenceLine(evidence) {
    if (!evidence.length) return null;
    const text = evidence.map(evidenceText).join(" · ");
    const title = evidence
      .map((e) => {
        const read = e.read_as && e.read_as.length && e.read_as.join(", ") !== e.term
          ? `, read as ${e.read_as.join(", ")}` : "";
        const from = e.words && e.words.length && e.value >= 0.01
          ? `, from ${[...new Set(e.words)].join(", ")}` : "";
        return `${e.term}: ${e.kind}${read}${from}${e.dims.length ? ` (dims ${e.dims.join(", ")})` : ""}`;
      })
      .join("; ");
    return el("div", { class: "evidence", title }, text);
  }

  function syncUrl() {
    const params = new URLSearchParams();
    if (state.like && state.like.kind === "item") params.set("like", state.like.id);
    else params.set("q", includeBox.value.trim());
    if (excludeBox.value.trim()) params.set("not", excludeBox.value.trim());
    if (strategySelect.value && strategySelect.value !== strategySelect.dataset.default) {
      params.set("strategy", strategySelect.value);
    }
    if (minScoreSelect.value) params.set("min", minScoreSelect.value);
    history.replaceState(null, "", `?${params}`);
  }

  /** Search with the boxes' contents (append: fetch the next page of the last search). */
  async function runSearch(append) {
    const q = includeBox.value.trim();
    if (!append && q && state.like) setLike(null); // typed text: back to a text search
    if (!q && !state.like && !splitTerms(excludeBox.value).length) {
      ++state.seq; // an answer still on its way is no longer wanted
      clearResults();
      showError("Type what to search for (or only what to leave out: 'no people').");
      return;
    }
    const request = append
      ? { ...state.request, offset: state.nextOffset }
      : {
          q,
          exclude: splitTerms(excludeBox.value),
          k: PAGE_SIZE,
          offset: 0,
          strategy: strategySelect.value || undefined,
          min_score: minScoreSelect.value ? Number(minScoreSelect.value) : undefined,
          count: true, // "N of M items match" in the status line
          like: state.like && state.like.kind === "item" ? state.like.id : undefined,
          image: state.like && state.like.kind === "image" ? state.like.file : undefined,
        };
    const seq = ++state.seq; // answers to older searches are dropped
    showError("");
    statusLine.textContent = "searching…";
    results.setAttribute("aria-busy", "true");
    try {
      const data = request.image ? await searchImage(request) : await api("api/search", {
        method: "POST",
        body: JSON.stringify({ ...request, image: undefined }),
      });
      if (seq !== state.seq) return;
      state.request = request;
      state.query = data.query;
      state.nextOffset = data.next_offset;
      if (!append) {
        results.replaceChildren();
        closePanel();
      }
      results.append(...data.hits.map((h) => renderHit(h, data.probabilistic)));
      const n = results.children.length;
      // every item is ranked; when the list ended early, the count is exact
      const of = data.next_offset === null ? n : data.total;
      const flagged = results.querySelectorAll(".card.violates").length;
      const matches = data.matches === null || data.matches === undefined ? "" :
        ` · ${data.matches} of ${data.total} items match at ${Math.round(100 * data.threshold)}% or more`;
      statusLine.textContent = n
        ? (data.probabilistic
            ? `Showing ${n} for ${describe(data.query)}`
            : `Showing ${n} of ${of} for ${describe(data.query)}`) +
          matches +
          (flagged ? ` · ${flagged} marked ✗ show a term you left out (by their labels, or 50% likely)` : "")
        : `No results for ${describe(data.query)}${matches}.`;
      for (const note of data.notes || []) statusLine.textContent += ` · ${note}`;
      const unknown = data.unknown_words || [];
      if (unknown.length) {
        statusLine.textContent +=
          ` · not a word this collection knows: ${unknown.join(", ")} (searched by its ` +
          "pieces; check the spelling)";
      }
      moreButton.hidden = data.next_offset === null;
      results.dataset.query = data.like
        ? `like ${data.like}${data.query.text ? ` ${data.query.text}` : ""}`
        : data.query.text;
      syncUrl();
    } catch (error) {
      if (seq !== state.seq) return;
      // the previous answer is not the answer to this query: never leave it under the error
      if (!append) clearResults();
      showError(error.message);
    } finally {
      if (seq === state.seq) results.removeAttribute("aria-busy");
    }
  }

  /** Empty the grid (and its status, "more" button and "why" panel). */
  function clearResults() {
    results.replaceChildren();
    delete results.dataset.query;
    statusLine.textContent = "";
    moreButton.hidden = true;
    state.request = null;
    state.nextOffset = null;
    closePanel();
  }

  /** POST the uploaded picture with the query's exclusions as URL parameters. */
  function searchImage(request) {
    const params = new URLSearchParams({ k: String(request.k), offset: String(request.offset) });
    for (const term of request.exclude) params.append("exclude", term);
    if (request.strategy) params.set("strategy", request.strategy);
    if (request.min_score !== undefined) params.set("min_score", String(request.min_score));
    return api(`api/search/image?${params}`, {
      method: "POST",
      body: request.image,
      headers: { "content-type": request.image.type || "application/octet-stream" },
    });
  }

  // ------------------------------------------------------------------ side panel

  function openPanel(children) {
    // replaceChildren would insert a null as the text "null"
    panelBody.replaceChildren(...children.filter((c) => c !== null && c !== undefined && c !== false));
    panel.hidden = false;
    document.body.classList.add("panel-open");
  }

  function closePanel() {
    panel.hidden = true;
    document.body.classList.remove("panel-open");
    panelBody.replaceChildren();
    state.explained = null;
    for (const card of results.querySelectorAll(".card.selected")) card.classList.remove("selected");
  }

  function selectCard(id) {
    for (const card of results.querySelectorAll(".card")) {
      card.classList.toggle("selected", card.dataset.id === id);
    }
  }

  function dimButton(dim) {
    return el(
      "button",
      { type: "button", class: "link", title: "show this concept's top items", onclick: () => showDim(dim) },
      `dim ${dim}`,
    );
  }

  function excludeButton(concept) {
    const term = conceptTerm(concept);
    if (isSearched(term)) return el("span", { class: "muted" }, "searched");
    return el(
      "button",
      { type: "button", class: "small", dataset: { term }, onclick: () => addExclusion(term) },
      `but not “${term}”`,
    );
  }

  function conceptTable(concepts, weightTitle) {
    const top = Math.max(...concepts.map((c) => c.weight), 1e-9);
    const rows = concepts.map((c) => {
      const bar = el("span", { class: "bar" });
      bar.style.width = `${Math.round((100 * c.weight) / top)}%`;
      return el(
        "tr",
        { dataset: { dim: String(c.dim) } },
        el("td", {}, dimButton(c.dim)),
        el("td", { class: "weight", title: weightTitle }, el("span", { class: "bar-box" }, bar), c.weight.toFixed(3)),
        el("td", {}, c.words.slice(0, 5).join(", ") || "(no label)"),
        el("td", {}, excludeButton(c)),
      );
    });
    return el("table", { class: "concepts" }, el("tbody", {}, rows));
  }

  /** An excluded term's check: absent (nothing on its dims), faint (every value at most the
   *  filter threshold) or present. */
  function checkRow(check, labels = []) {
    const peak = check.item_peak;
    let [cls, verdict] =
      peak === 0
        ? ["ok", "✓ absent"]
        : peak <= state.filterThreshold
          ? ["ok", "✓ faint"]
          : ["bad", "✗ present"];
    // the item's labels are what it shows: the verdict never contradicts them
    const term = wordsOf(check.term).join(" ");
    if (labels.some((l) => wordsOf(l).join(" ") === term)) {
      [cls, verdict] = ["bad", cls === "ok" ? "✗ in its labels (the codes missed it)" : "✗ present"];
    }
    const dims = check.dims.length ? check.dims.slice(0, 8).join(", ") : "none";
    const more = check.dims.length > 8 ? ` +${check.dims.length - 8}` : "";
    return el(
      "li",
      { class: `check ${cls}`, dataset: { term: check.term } },
      el("strong", {}, `“${check.term}”`),
      ` dims ${dims}${more}`,
      check.words.length ? ` (${check.words.join(", ")})` : "",
      el(
        "span",
        {
          class: "verdict",
          title:
            "peak: this item's largest value on the term's concept dims; mass: their sum. " +
            `The filter strategy drops items above ${state.filterThreshold} on the dims it selects.`,
        },
        `${verdict} · peak ${peak.toFixed(3)} · mass ${check.item_mass.toFixed(3)}`,
      ),
    );
  }

  function renderExplanation(data) {
    const item = data.item;
    const others = item.captions.slice(1);
    return [
      el("div", { class: "panel-image" }, thumbnail(item, 320, true)),
      el("h2", {}, item.caption || item.id),
      el("p", { class: "muted" }, `id ${item.id}`, item.labels.length ? ` · labels: ${item.labels.join(", ")}` : ""),
      (item.also || []).length ? el("p", { class: "muted also" }, `also: ${item.also.join(", ")}`) : null,
      others.length ? el("ul", { class: "captions" }, others.map((c) => el("li", {}, c))) : null,
      el("h3", {}, "Matched concepts"),
      el("p", { class: "note" }, `Concept dimensions shared by ${describe(data.query)} and this item; weight = contribution to the score.`),
      data.matched.length
        ? conceptTable(shownConcepts(data.matched, 0, data.matched.length), "contribution to the score")
        : el("p", { class: "muted" }, state.like && state.like.kind === "image"
          ? "Shared concepts are shown for text and “more like this” searches."
          : "No concept in common with the query."),
      el("h3", {}, "Excluded concepts checked"),
      data.excluded.length
        ? el("ul", { class: "checks" }, data.excluded.map((c) => checkRow(c, item.labels)))
        : el("p", { class: "muted" }, "Nothing excluded yet: type terms in “but not” or click a concept."),
      el("h3", {}, "Strongest concepts in this item"),
      shownConcepts(data.concepts, state.conceptFloor).length
        ? el("div", { class: "chips" }, shownConcepts(data.concepts, state.conceptFloor).map(chip))
        : el("p", { class: "muted" }, data.concepts.length
          ? "No concept stands out in this item."
          : "This item has no active concept."),
    ];
  }

  async function explain(id) {
    if (!state.request) return;
    const params = new URLSearchParams({ q: state.request.q });
    for (const term of state.request.exclude) params.append("exclude", term);
    if (state.request.like) params.set("like", state.request.like);
    state.explained = id;
    selectCard(id);
    openPanel([el("p", { class: "muted" }, "loading…")]);
    try {
      const data = await api(`api/items/${encodeURIComponent(id)}/explain?${params}`);
      if (state.explained === id) openPanel(renderExplanation(data));
    } catch (error) {
      openPanel([el("p", { class: "error" }, error.message)]);
    }
  }

  async function showDim(dim) {
    const back = state.explained;
    try {
      const data = await api(`api/dims/${dim}?n=12`);
      const concept = { dim: data.dim, words: data.words, weight: 0 };
      openPanel([
        back ? el("button", { type: "button", class: "link", onclick: () => explain(back) }, "← back to the result") : null,
        el("h2", {}, `Concept dim ${data.dim}`),
        el("p", {}, data.words.length ? data.words.join(", ") : "(no label words)"),
        data.spine_words.length && data.spine_words.join() !== data.words.join()
          ? el("p", { class: "muted" }, `SPINE words: ${data.spine_words.join(", ")}`)
          : null,
        el("p", {}, excludeButton(concept)),
        el("h3", {}, "Top items on this dimension"),
        el(
          "div",
          { class: "mini-grid" },
          data.items.map((it) =>
            el(
              "figure",
              { class: "mini", dataset: { id: it.id } },
              thumbnail(it, 96),
              el("figcaption", {}, `${it.value.toFixed(2)} · ${it.caption || it.id}`),
            ),
          ),
        ),
      ]);
    } catch (error) {
      openPanel([el("p", { class: "error" }, error.message)]);
    }
  }

  // ------------------------------------------------------------------------ start

  async function loadInfo() {
    try {
      const info = await api("api/health");
      $("collection-info").textContent =
        `${info.collection}: ${info.items} items, ${info.images} images, ${info.dims} concept dimensions`;
      state.strategies = info.strategies;
      state.defaultStrategy = info.default_strategy;
      strategySelect.dataset.default = info.default_strategy;
      fillStrategies();
      state.filterThreshold = info.filter_threshold;
      state.conceptFloor = info.concept_floor || 0;
      if (info.example) $("include").placeholder = `e.g. ${info.example}`;
    } catch (error) {
      showError(`The search service is not answering: ${error.message}`);
    }
  }

  /** The scorer menu: the default only, every scorer the collection can run with
   * "advanced" ticked (the research scorers mean nothing to someone finding photos). */
  function fillStrategies() {
    const chosen = strategySelect.value || state.defaultStrategy;
    const offered = advancedBox.checked ? state.strategies : [state.defaultStrategy];
    strategySelect.replaceChildren(
      ...offered.map((s) =>
        el("option", { value: s, selected: s === chosen }, s === state.defaultStrategy ? `${s} (default)` : s)),
    );
    strategySelect.closest("label").hidden = !advancedBox.checked;
  }

  advancedBox.addEventListener("change", () => {
    if (!advancedBox.checked) strategySelect.value = state.defaultStrategy;
    fillStrategies();
  });

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    runSearch(false);
  });
  moreButton.addEventListener("click", () => runSearch(true));
  uploadInput.addEventListener("change", () => {
    const file = uploadInput.files && uploadInput.files[0];
    if (!file) return;
    setLike({ kind: "image", file });
    runSearch(false);
  });
  $("like-clear").addEventListener("click", () => {
    setLike(null);
    results.replaceChildren();
    statusLine.textContent = "";
    includeBox.focus();
  });
  $("panel-close").addEventListener("click", closePanel);
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && !panel.hidden) closePanel();
  });

  loadInfo().then(() => {
    const params = new URLSearchParams(location.search);
    if (params.get("strategy") && params.get("strategy") !== state.defaultStrategy) {
      advancedBox.checked = true;
      fillStrategies();
      strategySelect.value = params.get("strategy");
    }
    if (params.get("min")) minScoreSelect.value = params.get("min");
    if (params.get("not")) excludeBox.value = params.get("not");
    if (params.get("like")) {
      setLike({ kind: "item", id: params.get("like"), item: null });
      runSearch(false);
    } else if (params.get("q")) {
      includeBox.value = params.get("q");
      runSearch(false);
    }
    document.body.dataset.ready = "true";
  });
})();
