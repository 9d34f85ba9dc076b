// One NestJS app (platform-express), one handler; CONTENDER picks the idempotency layer in front
// of it. Started in its own process by bench/run.js; reports its port over IPC.
import { Body, Controller, Module, Post } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { serveCommands } from '../lib/proc.js';
import { delay, stats, work } from './work.js';

const CONTENDER = process.env.CONTENDER ?? 'nest-bare';
/** Every key or prefix this server writes contains RUN_ID, so run.js can delete them afterwards. */
const RUN_ID = process.env.RUN_ID ?? `rsbench-${process.pid}`;

/** Each contender: the modules the app imports, the decorators the route gets. */
const contenders = {
  'nest-bare': async () => ({ imports: [], decorators: [] }),

  // As its README says: the module, and @Idempotent() on the handler.
  'nest-node-idempotency-memory': async () => {
    const { NodeIdempotencyModule, Idempotent } = await import('@node-idempotency/nestjs');
    return {
      imports: [
        NodeIdempotencyModule.forRootAsync({ storage: { adapter: 'memory' }, cacheKeyPrefix: RUN_ID }),
      ],
      decorators: [Idempotent()],
    };
  },

  'nest-retrysafe-memory': async () => {
    const { RetrysafeModule } = await import('retrysafe/nestjs');
    const { memoryStore } = await import('retrysafe/memory');
    return { imports: [RetrysafeModule.forRoot({ store: memoryStore() })], decorators: [] };
  },
};

const build = contenders[CONTENDER];
if (!build) throw new Error(`unknown CONTENDER ${CONTENDER}`);

try {
  const { imports, decorators } = await build();
  class OrdersController {
    create(body) {
      return work(body);
    }
  }
  // Plain JavaScript: the decorators are applied by calling them, as TypeScript's would be.
  const { prototype } = OrdersController;
  const create = Object.getOwnPropertyDescriptor(prototype, 'create');
  for (const decorate of [Post(), ...decorators]) decorate(prototype, 'create', create);
  Body()(prototype, 'create', 0);
  Controller('orders')(OrdersController);
  class AppModule {}
  Module({ imports, controllers: [OrdersController] })(AppModule);

  const app = await NestFactory.create(AppModule, {
    logger: false,
    abortOnError: false,
    forceCloseConnections: true,
  });
  app.getHttpAdapter().getInstance().disable('x-powered-by');
  await app.listen(0, '127.0.0.1');
  process.send?.({ ready: app.getHttpServer().address().port });
  serveCommands({ stats, delay });
  process.on('SIGTERM', async () => {
    await app.close();
    process.exit(0);
  });
} catch (error) {
  process.send?.({ failed: String(error?.message ?? error) });
  process.exit(1);
}
