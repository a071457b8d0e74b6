// A cited passage in its place: the page of a PDF (or image) with the passage highlighted, and for every
// document the chunk inside the text of its section. Fills the source panel's #source-page and #source-text.

import { apiFetch, apiJson, describeError } from "./api.js";

// Every string this module shows, in one place.
export const STRINGS = {
  pageAlt: (page, source) => `Page ${page} of ${source}, the cited passage highlighted`,
  pageCaption: (page) => `Page ${page}, the passage highlighted`,
  loading: "Loading the passage in its place…",
  pageFailed: (why) => `The page could not be shown: ${why}`,
  contextFailed: (why) => `The text around the passage could not be shown: ${why}`,
};

const $ = (id) => document.getElementById(id);
const PAGE_WIDTH = 1000; // pixels asked for; the panel scales the image down
let shown = 0; // the latest request wins: an earlier one that answers late changes nothing
let pageUrl = null;

// Shows `source` (an entry of the `sources` event, with the collection it was searched in) in its place.
export async function showInPlace(source) {
  const ticket = ++shown;
  clearPlace();
  const index = chunkIndex(source.chunk_id);
  if (!source.doc_id || index === null) return;
  const status = $("source-place-status");
  status.textContent = STRINGS.loading;
  status.hidden = false;
  const query = source.collection ? `?collection=${encodeURIComponent(source.collection)}` : "";
  const base = `/v1/documents/${encodeURIComponent(source.doc_id)}`;
  let chunk = null;
  try {
    chunk = await apiJson(`${base}/chunks/${index}${query}`);
  } catch (error) {
    if (ticket === shown) status.textContent = STRINGS.contextFailed(describeError(error));
    return;
  }
  if (ticket !== shown) return;
  showContext(chunk);
  status.hidden = true;
  if (chunk.page && chunk.page_image) await showPage(ticket, base, chunk, source, query);
}

export function clearPlace() {
  if (pageUrl) URL.revokeObjectURL(pageUrl);
  pageUrl = null;
  $("source-page").hidden = true;
  $("source-page-frame").replaceChildren(); // the image exists only while a page is shown
  $("source-place-status").hidden = true;
}

function chunkIndex(chunkId) {
  const tail = String(chunkId || "").split(":").pop();
  return /^\d+$/.test(tail) ? Number(tail) : null;
}

// The chunk marked inside its section's text (nodes from text only: nothing is parsed as markup).
function showContext(chunk) {
  const text = $("source-text");
  const mark = document.createElement("mark");
  mark.className = "cited";
  mark.textContent = chunk.text;
  text.replaceChildren(
    document.createTextNode(chunk.before ? `${chunk.before}\n\n` : ""),
    mark,
    document.createTextNode(chunk.after ? `\n\n${chunk.after}` : ""),
  );
  mark.scrollIntoView({ block: "nearest" });
}

async function showPage(ticket, base, chunk, source, query) {
  const status = $("source-place-status");
  const sep = query ? "&" : "?";
  let blob;
  try {
    const response = await apiFetch(`${base}/pages/${chunk.page}${query}${sep}chunk=${chunk.index}&width=${PAGE_WIDTH}`);
    if (!response.ok) throw new Error(`${response.status} ${response.statusText}`);
    blob = await response.blob();
  } catch (error) {
    if (ticket === shown) {
      status.textContent = STRINGS.pageFailed(describeError(error));
      status.hidden = false;
    }
    return;
  }
  if (ticket !== shown) return;
  pageUrl = URL.createObjectURL(blob);
  const image = document.createElement("img");
  image.id = "source-page-image";
  $("source-page-frame").replaceChildren(image);
  image.alt = STRINGS.pageAlt(chunk.page, source.source || chunk.source);
  $("source-page-caption").textContent = STRINGS.pageCaption(chunk.page);
  image.addEventListener("load", () => scrollToPassage(image, chunk.boxes), { once: true });
  image.src = pageUrl;
  $("source-page").hidden = false;
}

// Scrolls the page's frame so the first highlighted line is in view.
function scrollToPassage(image, boxes) {
  if (!boxes || !boxes.length) return;
  const frame = image.parentElement;
  const top = Math.min(...boxes.map((b) => b[1])) * image.clientHeight;
  frame.scrollTop = Math.max(0, top - 40);
}
