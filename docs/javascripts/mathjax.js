// MathJax for pymdownx.arithmatex (generic mode): $…$ inline, $$…$$ display. MathJax is served by the site
// (docs/hooks/mathjax.py), so it loads before Material's page event: it typesets from that event only, once
// ready — typesetting at its own startup too would race the event, whose clearCache() then drops the
// glyphs' styles and leaves the formulas blank.
window.MathJax = {
  tex: {inlineMath: [["\\(", "\\)"]], displayMath: [["\\[", "\\]"]], processEscapes: true, processEnvironments: true},
  options: {ignoreHtmlClass: ".*|", processHtmlClass: "arithmatex"},
  startup: {
    typeset: false,
    ready() {
      MathJax.startup.defaultReady();
      document$.subscribe(() => {  // every page shown, the first one included (the event replays)
        MathJax.startup.output.clearCache();
        MathJax.typesetClear();
        MathJax.texReset();
        MathJax.typesetPromise();
      });
    },
  },
};
