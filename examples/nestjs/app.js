import { BadRequestException, Body, Controller, Module, Post, Res } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { IdempotencyCtx, Idempotent, RetrysafeModule } from 'retrysafe/nestjs';
import { sqliteStore } from 'retrysafe/sqlite';

let orders = 0;

class OrdersController {
  create(body, idem, res) {
    if (typeof body?.item !== 'string') throw new BadRequestException('send a JSON order with an item');
    const id = ++orders;
    res.header('location', `/orders/${id}`);
    return { id, order: body, key: idem.key };
  }
}

// Plain JavaScript has no decorator syntax; this applies them as TypeScript's would:
// @Post() @Idempotent({ required: true }) create(@Body() body, @IdempotencyCtx() idem, @Res({ passthrough: true }) res)
const { prototype } = OrdersController;
const create = Object.getOwnPropertyDescriptor(prototype, 'create');
for (const decorate of [Post(), Idempotent({ required: true })]) decorate(prototype, 'create', create);
for (const [index, param] of [Body(), IdempotencyCtx(), Res({ passthrough: true })].entries()) {
  param(prototype, 'create', index);
}
Controller('orders')(OrdersController);

class AppModule {}
Module({
  imports: [RetrysafeModule.forRoot({ store: sqliteStore({ url: 'idempotency.db', migrate: true }) })],
  controllers: [OrdersController],
})(AppModule);

const app = await NestFactory.create(AppModule);
const port = Number(process.env.PORT ?? 3000);
await app.listen(port, process.env.HOST ?? '127.0.0.1');
console.log(`listening on http://localhost:${port}`);
