// What both pages write into their document: the status line and table cells.

const status = document.getElementById('status');

/** Shows `text` in the page's status line; `tone` ('done', 'error') is its class. */
export function say(text, tone = '') {
  status.textContent = text;
  status.className = tone;
}

/** A table cell holding `text`, with an optional class and title. */
export function cell(text, { className, title } = {}) {
  const td = document.createElement('td');
  td.textContent = text;
  if (className) td.className = className;
  if (title) td.title = title;
  return td;
}
