/**
 * The median of `values`: the middle one, or the mean of the two middle ones; non-finite values
 * (a failed round) are left out, and none left is NaN. Kept apart from load.js so that a script
 * counting instructions or CPU need not load autocannon.
 */
export function median(values) {
  const sorted = values.filter((v) => Number.isFinite(v)).sort((a, b) => a - b);
  if (sorted.length === 0) return Number.NaN;
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
}
