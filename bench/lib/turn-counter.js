// Preloaded into a bench server (`--import`): counts the promises the process creates and the
// promise reaction jobs it runs, and answers `{ cmd: 'turns' }` over IPC with the totals so far.
// The answer is sent synchronously from the message handler, so asking costs no promise itself.
import { promiseHooks } from 'node:v8';

const totals = { promises: 0, reactions: 0 };
promiseHooks.createHook({
  init() {
    totals.promises++;
  },
  before() {
    totals.reactions++;
  },
});
process.on('message', (message) => {
  if (message?.cmd === 'turns') process.send({ reply: 'turns', value: { ...totals } });
});
