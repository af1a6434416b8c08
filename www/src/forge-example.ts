/**
 * "Forge an example tool": forges `slugify` through `agent.forge()`, so the stages (sandbox
 * tests, judge, registration) can be watched whatever the model; small local models rarely
 * write a `forge_tool` call that works.
 */
import { SLUGIFY_EXAMPLE } from '../../npm/examples/slugify-forge.ts';
import type { App } from './app.ts';
import { $, errorText, setDisabled } from './dom.ts';
import { explain } from './chat.ts';

export function mountForgeExample(app: App): void {
  const button = $<HTMLButtonElement>('#forge-example');
  const stop = $<HTMLButtonElement>('#forge-example-stop');
  const status = $('#forge-example-status');
  // The forge in flight: a slow judge (a small model on a CPU) would otherwise hold the page's
  // Apply ("wait until the example forge is done") for as long as it takes.
  let controller: AbortController | undefined;
  const enable = () => {
    button.disabled = !app.runtime?.emergentAvailable;
    // While a forge goes: shown disabled, keeping the focus (the click handler ignores it).
    setDisabled(button, controller !== undefined);
  };
  app.onRuntime(() => {
    enable();
    // What the last forge registered was in the previous agent's session.
    status.textContent = '';
  });
  stop.addEventListener('click', () => controller?.abort());
  button.addEventListener('click', async () => {
    const runtime = app.runtime;
    if (!runtime || controller) return;
    const forging = (controller = new AbortController());
    enable();
    stop.hidden = false;
    // The button does nothing until the forge ends: the focus goes on to its Stop.
    if (document.activeElement === button) stop.focus();
    status.textContent = 'Forging slugify: its tests run in the sandbox, then the judge reviews it…';
    try {
      const result = await app.during('the example forge', () => runtime.forge(SLUGIFY_EXAMPLE, app.sessionId, forging.signal));
      status.textContent = !result.success
        ? judgeUnreachable(result.reason)
          ? `Rejected: the judge (the model) could not be asked. ${explain('provider_network', undefined, result.reason, { kind: runtime.settings.kind })}`
          : `Rejected (${result.category}): ${result.reason}`
        : result.unchanged
          ? `slugify v${result.tool.version} (${result.tool.tier} tier) is this very tool already: nothing was tested or judged again. Ask the chat to slugify a title.`
          : `Registered slugify v${result.tool.version} in this session. Ask the chat to slugify a title; promote it to keep it after a reload.`;
    } catch (error) {
      if ((error as { code?: unknown } | null)?.code === 'aborted') {
        status.textContent = 'Stopped: nothing was registered.';
        // agent.forge() events carry the run id "".
        app.runEnded('', SLUGIFY_EXAMPLE.name);
      } else status.textContent = `Could not forge: ${errorText(error)}`;
    } finally {
      controller = undefined;
      // Hidden, Stop would drop the focus to the top of the page: back to the forge button.
      if (document.activeElement === stop) button.focus();
      stop.hidden = true;
      enable();
      app.refreshSoon();
    }
  });
}

/** Whether a forge was rejected because its judge's model could not be reached (fail-closed:
 *  no verdict, no tool), which says nothing about the tool. */
function judgeUnreachable(reason: string | undefined): reason is string {
  return reason !== undefined && /provider_network/.test(reason);
}
