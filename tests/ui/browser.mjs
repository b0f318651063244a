// The occupancy page in headless Chromium (Debian's /usr/bin/chromium, driven by playwright-core):
// opens the page at argv[2], reads what it shows from the DOM, writes a screenshot to argv[3],
// uses the filters (the form, and narrowing as one types) and prints one JSON object on stdout:
// {all, mig, typed, mig_without_js, errors}. tests/ui.rs starts the service and checks the result.
import { chromium } from "playwright-core";

const [url, shot] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  // As root, Chromium needs --no-sandbox; the rest keeps it off the (closed) network.
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  const errors = [];
  page.on("console", (m) => { if (m.type() === "error") errors.push(m.text()); });
  page.on("pageerror", (e) => errors.push(String(e)));
  const read = () => page.evaluate(() => ({
    nodes: [...document.querySelectorAll("article.node")].filter((a) => !a.hidden).map((a) => a.dataset.node),
    pods: [...document.querySelectorAll("article.node [data-pod]")].map((e) => [e.closest("article").dataset.node, e.dataset.pod]),
    pending: [...document.querySelectorAll("#pending tr[data-pod]")].map((r) => ({ pod: r.dataset.pod, reason: r.querySelector(".reason").textContent })),
  }));
  await page.goto(url);
  const all = await read();
  await page.screenshot({ path: shot, fullPage: true });
  // The class filter applies as it changes (page.js submits the form).
  await Promise.all([page.waitForNavigation(), page.selectOption("select[name=class]", "mig")]);
  const mig = await read();
  // The node filter narrows the page as one types.
  await page.goto(url);
  await page.fill("input[name=node]", "h100");
  const typed = await read();
  // Without JavaScript the filters still work: the form's GET, rendered by the server.
  const plain = await browser.newContext({ javaScriptEnabled: false });
  const noJs = await plain.newPage();
  await noJs.goto(url);
  await noJs.selectOption("select[name=class]", "mig");
  await Promise.all([noJs.waitForNavigation(), noJs.click("button[type=submit]")]);
  const mig_without_js = await noJs.evaluate(() =>
    [...document.querySelectorAll("article.node")].map((a) => a.dataset.node));
  await plain.close();
  console.log(JSON.stringify({ all, mig, typed, mig_without_js, errors }));
} finally {
  await browser.close();
}
