import { connection } from 'next/server';
import { actionKey, KEY_FIELD } from 'retrysafe/next';
import { OrderForm } from './order-form.js';

export default async function Page() {
  // Rendered per request: a key minted at build time would be every visitor's.
  await connection();
  return (
    <main>
      <h1>Order</h1>
      <OrderForm idempotencyKey={actionKey()} keyField={KEY_FIELD} />
    </main>
  );
}
