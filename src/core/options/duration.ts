import ms from 'ms';
import { ConfigError } from '../contract/index.js';

/**
 * Milliseconds as a number, or a string `ms` reads, such as `'30s'`, `'15m'`, `'24h'`, `'7d'`,
 * `'1.5 hours'`; a typo such as `'7dd'` fails to compile.
 */
export type Duration = number | ms.StringValue;

/**
 * Milliseconds of a duration read at run time (an environment variable, a config file): a number
 * of ms, a string of digits (ms), or a string such as `'30s'`, `'7d'`. Throws a ConfigError naming
 * `name` when the value is none of those or is below `min`.
 * @example
 * const ttlMs = parseDuration(process.env.IDEMPOTENCY_TTL ?? '24h', { name: 'IDEMPOTENCY_TTL', min: 1 });
 */
export function parseDuration(
  value: number | string,
  { name = 'duration', min = 0 }: { name?: string; min?: number } = {},
): number {
  const parsed =
    typeof value === 'number'
      ? value
      : typeof value === 'string' && value !== ''
        ? ms(value as ms.StringValue)
        : NaN;
  if (typeof parsed !== 'number' || !Number.isFinite(parsed) || parsed < min) {
    throw new ConfigError(
      `retrysafe: ${name} must be a duration of at least ${min} ms (a number of ms or a string like '30s', '7d'); got ${JSON.stringify(value)}`,
    );
  }
  return Math.round(parsed);
}

/** Parses a duration option once, at construction; throws a ConfigError naming the option. */
export function toMs(option: string, value: Duration, { min = 0 }: { min?: number } = {}): number {
  return parseDuration(value, { name: `option \`${option}\``, min });
}
