/* The search page's summaries are the text of the page they come from (Sphinx's searchtools
   reads the page's HTML). There a formula is its TeX, `\(m_h (i - j)\)`; this script rewrites each
   formula of that HTML as plain text first (`m_h (i − j)`, `2^(-8/n)`, Greek letters and operators
   as their characters), and leaves out its code blocks, so that a summary reads as prose. Loaded by search_math.py on every page;
   without searchtools.js it does nothing. */
"use strict";

const TEX_SYMBOLS = {
  alpha: "α", beta: "β", gamma: "γ", delta: "δ", epsilon: "ε", varepsilon: "ε", zeta: "ζ",
  eta: "η", theta: "θ", iota: "ι", kappa: "κ", lambda: "λ", mu: "μ", nu: "ν", xi: "ξ", pi: "π",
  rho: "ρ", sigma: "σ", tau: "τ", phi: "φ", varphi: "φ", chi: "χ", psi: "ψ", omega: "ω",
  Gamma: "Γ", Delta: "Δ", Theta: "Θ", Lambda: "Λ", Xi: "Ξ", Pi: "Π", Sigma: "Σ", Phi: "Φ",
  Psi: "Ψ", Omega: "Ω", ell: "ℓ", sum: "∑", prod: "∏", int: "∫", infty: "∞", partial: "∂",
  nabla: "∇", cdot: "·", cdots: "⋯", ldots: "…", dots: "…", times: "×", odot: "⊙",
  otimes: "⊗", oplus: "⊕", le: "≤", leq: "≤", ge: "≥", geq: "≥", ne: "≠", neq: "≠",
  approx: "≈", sim: "∼", equiv: "≡", propto: "∝", in: "∈", notin: "∉", subset: "⊂",
  to: "→", rightarrow: "→", leftarrow: "←", Rightarrow: "⇒", mapsto: "↦", pm: "±", mp: "∓",
  top: "⊤", prime: "′", sqrt: "√", lfloor: "⌊", rfloor: "⌋", lceil: "⌈", rceil: "⌉",
  langle: "⟨", rangle: "⟩", mid: "|", vert: "|", lvert: "|", rvert: "|", Vert: "‖",
};

/* A formula's TeX as readable text: delimiters, spacing commands, \left/\right and font
   commands dropped; symbols as characters; \frac{a}{b} as a/b; braces dropped. */
function texToText(tex) {
  let text = tex.trim()
    .replace(/^\\\(|\\\)$/g, "").replace(/^\\\[|\\\]$/g, "").replace(/^\$+|\$+$/g, "")
    .replace(/\\begin\{[a-z*]+\}|\\end\{[a-z*]+\}/g, " ")
    .replace(/\\\\|&/g, " ")
    .replace(/\\(left|right|big|Big|bigg|Bigg)\b\\?/g, "")
    .replace(/\\[,;:! ]/g, " ").replace(/\\q?quad\b/g, " ")
    .replace(/\\(?:mathrm|mathbf|mathit|mathcal|mathbb|operatorname|text|textrm|textit|boldsymbol)\s*\{([^{}]*)\}/g, "$1")
    .replace(/\\frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}/g, "($1)/($2)")
    .replace(/\\([A-Za-z]+)/g, (whole, name) => TEX_SYMBOLS[name] ?? name)
    .replace(/\\([{}$%#_])/g, "$1");
  // A sub- or superscript of one character (and its primes) as it is (m_h, V_t'), a longer one
  // in parentheses (2^(-8/n)), innermost first.
  for (let previous = ""; previous !== text;) {
    previous = text;
    text = text.replace(/([_^])\{([^{}]*)\}/g, (whole, mark, inner) =>
      mark + (/^\S'*$/.test(inner.trim()) ? inner.trim() : `(${inner.trim()})`));
  }
  text = text
    .replace(/[{}]/g, "")
    .replace(/(\w) - /g, "$1 − ")
    .replace(/\s+/g, " ");
  return text.trim();
}

(() => {
  if (typeof Search === "undefined" || !Search.htmlToText) return;
  const htmlToText = Search.htmlToText;
  Search.htmlToText = (htmlString, anchor) => {
    const page = new DOMParser().parseFromString(htmlString, "text/html");
    // Code blocks (a notebook's cells and outputs, an annotated page's code column) are left out:
    // a summary cut from them read `__all__ = ['get_slopes', ...` or a run of imports.
    page.querySelectorAll("div.highlight, pre").forEach((code) => code.remove());
    page.querySelectorAll(".math").forEach((math) => { math.textContent = texToText(math.textContent); });
    return htmlToText(page.documentElement.outerHTML, anchor);
  };
})();
