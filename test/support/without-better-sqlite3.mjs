// Loaded with `node --import` to run a process as if better-sqlite3 were not installed: its
// resolution fails the way a missing package's does, for `import` and `require` alike.
import { registerHooks } from 'node:module';

registerHooks({
  resolve(specifier, context, nextResolve) {
    if (specifier === 'better-sqlite3') {
      throw Object.assign(new Error("Cannot find module 'better-sqlite3'"), { code: 'MODULE_NOT_FOUND' });
    }
    return nextResolve(specifier, context);
  },
});
