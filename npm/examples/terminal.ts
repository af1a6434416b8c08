/**
 * Text from a model or a tool, made safe to print to a terminal: control characters (ESC
 * sequences among them, which can rewrite the screen, set the window title or, through OSC 52,
 * the clipboard) are shown escaped as `\u001b`, never sent as they are. Newlines and tabs stay.
 */
export function printable(text: string): string {
  // eslint-disable-next-line no-control-regex
  return text.replace(/[\u0000-\u0008\u000b-\u001f\u007f-\u009f]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
}

/** `console.log` of a line made {@link printable}. */
export function say(line: string): void {
  console.log(printable(line));
}
