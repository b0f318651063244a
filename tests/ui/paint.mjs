// First paint of the occupancy page in headless Chromium: loads argv[2] argv[3] times (a fresh
// page each time, nothing cached) and prints one JSON object: per load, the first contentful
// paint and DOMContentLoaded in ms since navigation start, and the nodes drawn. Used by
// benches/ui.py; playwright-core drives Debian's /usr/bin/chromium as in browser.mjs.
import { chromium } from "playwright-core";

const [url, times] = [process.argv[2], Number(process.argv[3] || 5)];
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
try {
  const loads = [];
  for (let i = 0; i < times; i++) {
    const context = await browser.newContext({ viewport: { width: 1400, height: 900 } });
    const page = await context.newPage();
    await page.goto(url, { waitUntil: "load" });
    loads.push(await page.evaluate(async () => {
      const nav = performance.getEntriesByType("navigation")[0];
      // Paint entries arrive asynchronously: observe them (buffered), for at most 5 s.
      const fcp = await new Promise((resolve) => {
        const seen = (entries) => entries.find((e) => e.name === "first-contentful-paint");
        new PerformanceObserver((list, obs) => {
          const e = seen(list.getEntries());
          if (e) { obs.disconnect(); resolve(e.startTime); }
        }).observe({ type: "paint", buffered: true });
        setTimeout(() => resolve(null), 5000);
      });
      return {
        fcp_ms: fcp,
        dom_content_loaded_ms: nav.domContentLoadedEventEnd,
        response_end_ms: nav.responseEnd,
        bytes: nav.transferSize,
        nodes: document.querySelectorAll("article.node").length,
      };
    }));
    await context.close();
  }
  console.log(JSON.stringify(loads));
} finally {
  await browser.close();
}
