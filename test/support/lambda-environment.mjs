import { parentPort, workerData } from 'node:worker_threads';
import { DynamoDBClient, PutItemCommand } from '@aws-sdk/client-dynamodb';

// One Lambda execution environment: the handler's module loaded once (its client and store made
// at load, as in Lambda's init phase), then invocations as the parent sends them, run at once.
// Each answer reports how many orders this environment's handler has written so far.
let ordersWritten = 0;
const send = DynamoDBClient.prototype.send;
DynamoDBClient.prototype.send = function (command, ...rest) {
  if (command instanceof PutItemCommand && command.input.TableName === process.env.ORDERS_TABLE) {
    ordersWritten++;
  }
  return send.call(this, command, ...rest);
};

const { handler } = await import(workerData.handler);
parentPort.on('message', async (events) => {
  const results = await Promise.all(events.map((event) => handler(event, {})));
  parentPort.postMessage({ results, ordersWritten });
});
parentPort.postMessage('ready');
