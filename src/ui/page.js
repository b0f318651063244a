// gpu-share's occupancy page: interaction only. The page is complete without this script (the
// filters are a GET form); with it, a changed class applies at once, and the text filters narrow
// the nodes of this page as you type, before the form is sent.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  const form = document.getElementById("filters");
  if (!form) return;
  const cls = form.querySelector("select[name=class]");
  cls.addEventListener("change", () => form.submit());
  const text = (name) => form.querySelector(`input[name=${name}]`);
  const narrow = () => {
    const node = text("node").value.trim().toLowerCase();
    const model = text("model").value.trim().toLowerCase();
    let shown = 0;
    for (const a of document.querySelectorAll("article.node")) {
      const keep = a.dataset.node.toLowerCase().includes(node)
        && a.dataset.model.toLowerCase().includes(model);
      a.hidden = !keep;
      if (keep) shown += 1;
    }
    const count = document.getElementById("node-count");
    if (count && (node || model)) count.textContent = `${shown} nodes of this page match; press Filter for all pages.`;
  };
  text("node").addEventListener("input", narrow);
  text("model").addEventListener("input", narrow);
});
