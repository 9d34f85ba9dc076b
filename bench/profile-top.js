// node bench/profile-top.js <file.cpuprofile> [count=25]
// Prints the functions with the most self time in a V8 CPU profile (from `npm run bench -- --profile`).
import { readFileSync } from 'node:fs';

const [file, count = '25'] = process.argv.slice(2);
if (!file) {
  console.error('usage: node bench/profile-top.js <file.cpuprofile> [count]');
  process.exit(1);
}
const profile = JSON.parse(readFileSync(file, 'utf8'));
const byId = new Map(profile.nodes.map((node) => [node.id, node]));
const selfUs = new Map();
for (let i = 0; i < profile.samples.length; i++) {
  const id = profile.samples[i];
  selfUs.set(id, (selfUs.get(id) ?? 0) + (profile.timeDeltas[i] ?? 0));
}
const totals = new Map();
let all = 0;
for (const [id, us] of selfUs) {
  const { callFrame } = byId.get(id);
  const where = callFrame.url
    ? `${callFrame.url.replace(/^.*\/(node_modules|dist|examples)\//, '$1/')}:${callFrame.lineNumber + 1}`
    : '';
  const name = `${callFrame.functionName || '(anonymous)'} ${where}`.trim();
  totals.set(name, (totals.get(name) ?? 0) + us);
  all += us;
}
const idle = ['(idle)', '(program)', '(garbage collector)'].map((n) => totals.get(n) ?? 0);
console.log(
  `total ${(all / 1e6).toFixed(2)} s; idle ${(idle[0] / 1e6).toFixed(2)} s, program ${(idle[1] / 1e6).toFixed(2)} s, GC ${(idle[2] / 1e6).toFixed(2)} s`,
);
const busy = all - idle[0];
for (const [name, us] of [...totals].sort((a, b) => b[1] - a[1]).slice(0, Number(count))) {
  console.log(
    `${((100 * us) / busy).toFixed(1).padStart(5)}%  ${(us / 1000).toFixed(0).padStart(6)} ms  ${name}`,
  );
}
