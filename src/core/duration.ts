import ms from 'ms';
import { ConfigError } from './errors.js';

/** Milliseconds as a number, or a string such as `'30s'`, `'15m'`, `'24h'`, `'7d'`. */
export type Duration = number | string;

/** Parses a duration option once, at construction; throws a ConfigError naming the option. */
export function toMs(option: string, value: Duration, { min = 0 }: { min?: number } = {}): number {
  const parsed =
    typeof value === 'number' ? value : typeof value === 'string' ? ms(value as ms.StringValue) : NaN;
  if (typeof parsed !== 'number' || !Number.isFinite(parsed) || parsed < min) {
    throw new ConfigError(
      `retrysafe: option \`${option}\` must be a duration of at least ${min} ms (a number of ms or a string like '30s', '7d'); got ${JSON.stringify(value)}`,
    );
  }
  return Math.round(parsed);
}
