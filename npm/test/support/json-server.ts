// The transport of the tests' wire-format test doubles: a local HTTP server that reads each
// request's JSON body and hands it to the double, which writes the answer as its API would.
import { createServer, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

/** Starts a server on a free loopback port; `respond` gets each request's parsed JSON body, the
 *  response to write, and the body's text. `origin` is `http://127.0.0.1:<port>`. */
export async function startJsonServer<Body>(respond: (body: Body, res: ServerResponse, text: string) => unknown): Promise<{ server: Server; origin: string }> {
  const server = createServer(async (req, res) => {
    let text = '';
    for await (const piece of req) text += piece;
    await respond(JSON.parse(text) as Body, res, text);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { server, origin: `http://127.0.0.1:${(server.address() as AddressInfo).port}` };
}
