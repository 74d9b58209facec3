// Drives toy serve's chat page in a real headless browser (Debian's chromium through
// puppeteer-core): gives the API key when the page asks for one, types a message, and watches
// the reply arrive in pieces. Prints one JSON object; exits non-zero when something is wrong.
//   node chat_page_check.mjs URL [API_KEY]
import puppeteer from "puppeteer-core";
import fs from "node:fs";

const [url, apiKey = ""] = process.argv.slice(2);
const executablePath = process.env.CHROMIUM ||
  ["/usr/bin/chromium", "/usr/bin/chromium-browser"].find((p) => fs.existsSync(p));
if (!executablePath) {
  console.error("chat_page_check: no chromium (apt-get install chromium)");
  process.exit(2);
}
const browser = await puppeteer.launch({
  executablePath, headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-proxy-server"],
});
let code = 0;
try {
  const page = await browser.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  // Every page request must stay on the server: the page is self-contained (no CDN).
  const foreign = [];
  page.on("request", (r) => { if (!r.url().startsWith(url.replace(/\/$/, ""))) foreign.push(r.url()); });
  await page.goto(url, { waitUntil: "networkidle0", timeout: 30000 });
  const askedForKey = await page.$eval("#keybox", (e) => getComputedStyle(e).display !== "none");
  if (askedForKey) {
    await page.type("#key", apiKey);
    await page.click("#savekey");
  }
  // Record every state of the reply bubble as it changes. Each mutation record is read on its
  // own (the text node it added), not the bubble's text when the observer runs: when several
  // SSE events arrive in one network read the page updates the bubble several times in one
  // task, and the observer is called once for all of them.
  await page.evaluate(() => {
    window.__states = [];
    const inReply = (n) => (n.nodeType === 1 ? n : n.parentElement)?.closest(".msg.assistant");
    new MutationObserver((records) => {
      for (const r of records) {
        if (r.type === "characterData" && inReply(r.target)) window.__states.push(r.target.data);
        if (r.type !== "childList") continue;
        for (const n of r.addedNodes) {
          if (n.nodeType === 3 && r.target.closest?.(".msg.assistant")) window.__states.push(n.data);
          else if (n.nodeType === 1 && n.matches(".msg.assistant")) window.__states.push(n.textContent);
        }
      }
    }).observe(document.getElementById("log"), { childList: true, subtree: true, characterData: true });
  });
  await page.type("#input", "Tell me a story.");
  await page.keyboard.press("Enter");
  await page.waitForFunction(() => document.querySelector(".msg.user") && !document.querySelector(".msg.error") &&
    window.__states.length > 0, { timeout: 30000 });
  // Done when the reply stops changing for a second.
  let last = -1;
  for (let i = 0; i < 120; i++) {
    await new Promise((r) => setTimeout(r, 500));
    const n = await page.evaluate(() => window.__states.length);
    if (n === last) break;
    last = n;
  }
  const result = await page.evaluate(() => ({
    user: document.querySelector(".msg.user")?.textContent,
    reply: [...document.querySelectorAll(".msg.assistant")].pop()?.textContent ?? "",
    error: document.querySelector(".msg.error")?.textContent ?? null,
    states: [...new Set(window.__states.filter((s) => s.length > 0))],
  }));
  // The reply grows: each state a prefix of the next, the last the whole reply.
  const st = result.states;
  result.growing = st.length > 0 && st.every((s, i) => i === 0 || s.startsWith(st[i - 1])) &&
    st[st.length - 1] === result.reply;
  result.states = st.length;
  result.asked_for_key = askedForKey;
  result.page_errors = errors;
  result.foreign_requests = foreign;
  console.log(JSON.stringify(result));
  if (result.error || !result.reply || errors.length || foreign.length) code = 1;
} catch (e) {
  console.error(String(e));
  code = 1;
} finally {
  await browser.close();
}
process.exit(code);
