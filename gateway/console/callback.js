// The console's redirect URI, opened in the sign-in window: it hands the provider's answer
// (code and state, or an error) to the console's page on this origin over a
// BroadcastChannel, which needs no window.opener (an identity provider's
// Cross-Origin-Opener-Policy may sever it), then closes. It keeps nothing.
"use strict";
(() => {
  const channel = new BroadcastChannel("gateway-console-sign-in");
  channel.postMessage({ query: window.location.search });
  channel.close();
  window.close();
})();
