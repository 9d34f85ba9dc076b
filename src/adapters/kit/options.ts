import { ConfigError } from '../../core/contract/index.js';
import { checkOptions, ENGINE_OPTION_NAMES } from '../../core/options/index.js';

/** The option every adapter that has an error path of its own adds to the engine's. */
export interface RenderErrorsOption {
  renderErrors?: boolean;
}

/** An adapter's options, split: the engine's, and whether the adapter answers engine errors itself. */
export interface AdapterOptions<Options extends RenderErrorsOption> {
  renderErrors: boolean;
  engineOptions: Omit<Options, 'renderErrors'>;
}

const WITH_RENDER_ERRORS = [...ENGINE_OPTION_NAMES, 'renderErrors'];

/**
 * Splits an adapter's options into the engine's and `renderErrors` (default `true`), after
 * checking every name against both: a misspelt option fails here, naming the nearest one.
 */
export function splitAdapterOptions<Options extends RenderErrorsOption>(
  label: string,
  options: Options,
): AdapterOptions<Options> {
  const { renderErrors = true, ...engineOptions } = checkAdapterOptions(label, options);
  if (typeof renderErrors !== 'boolean') {
    throw new ConfigError('retrysafe: option `renderErrors` must be a boolean');
  }
  return { renderErrors, engineOptions };
}

/** Checks the names of an adapter's options, `renderErrors` included. */
export function checkAdapterOptions<Options extends RenderErrorsOption>(
  label: string,
  options: Options,
): Options {
  return checkOptions(label, options, WITH_RENDER_ERRORS);
}

/** Checks the options of an adapter that adds none to the engine's. */
export function engineOptionsOf<Options extends object>(label: string, options: Options): Options {
  return checkOptions(label, options, ENGINE_OPTION_NAMES);
}
