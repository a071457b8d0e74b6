// Server-sent events read from a fetch() body: EventSource can neither POST nor send an Authorization header.
// Follows the WHATWG parsing rules: CR, LF or CRLF line ends, comments, multi-line data, blank-line dispatch.

const LINE_END = /\r\n|\r|\n/;

// Yields {event, data} for each complete event; an incomplete last event is dropped, as the standard says.
// A caller that stops early (after the last event it needs) leaves the rest to be drained, so that the
// connection ends as the server ends it rather than whenever the unread body is torn down.
export async function* readEvents(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  const pending = { event: "message", data: [] };
  let buffer = "";
  let ended = false;
  try {
    for (;;) {
      const { value, done } = await reader.read();
      ended = done;
      if (done) return;
      buffer += value;
      // A CR at the very end may be the first half of a CRLF split across two reads: keep it back.
      const cut = buffer.endsWith("\r") ? buffer.length - 1 : buffer.length;
      const lines = buffer.slice(0, cut).split(LINE_END);
      buffer = lines.pop() + buffer.slice(cut);
      for (const line of lines) {
        const ready = feedLine(pending, line);
        if (ready) yield ready;
      }
    }
  } finally {
    if (ended) reader.releaseLock();
    else drain(reader);
  }
}

async function drain(reader) {
  try {
    while (!(await reader.read()).done);
  } catch (_) {
    // aborted by Stop, or the connection dropped: nothing is left to read
  }
}

function feedLine(pending, line) {
  if (line === "") {
    if (pending.data.length === 0) {
      pending.event = "message";
      return null;
    }
    const ready = { event: pending.event, data: pending.data.join("\n") };
    pending.event = "message";
    pending.data = [];
    return ready;
  }
  if (line.startsWith(":")) return null; // a comment: sse-starlette's keep-alive pings
  const colon = line.indexOf(":");
  const field = colon < 0 ? line : line.slice(0, colon);
  let value = colon < 0 ? "" : line.slice(colon + 1);
  if (value.startsWith(" ")) value = value.slice(1);
  if (field === "event") pending.event = value;
  else if (field === "data") pending.data.push(value);
  return null;
}
