// The gateway console: a page over the admin routes, with no powers of its own. Every
// call carries the admin's token (pasted, or from the identity provider) to the same routes
// and checks as any API client; the token lives in this closure only (no storage, no
// cookie), so a reload or signing out forgets it.
"use strict";
(() => {
  let token = null;
  let policyVersion = "";
  let provider = null; // {issuer, client_id, scope, discovery} when the console signs in there
  let pending = null; // the sign-in under way: {state, verifier, redirectUri}
  // The provider's session this page's sign-in went through, once the provider answered:
  // {idToken} (null where no ID token came). It outlives the page's own sign-out (an expired
  // token, "Not an admin") until the provider's session is ended: see `leave`.
  let atProvider = null;
  // The names of the claims that carry identity under the serving policy (its `claims:`,
  // and `user`, its directory's user claim), from GET /admin/index; the contract's names
  // until then.
  const CONTRACT_CLAIMS = {
    subject: "sub", tenant: "tenant", region: "region", groups: "groups", user: "sub",
  };
  let claimNames = CONTRACT_CLAIMS;
  // The signed-in part of the page (#app) as it loaded, before anyone signed in: see `freshApp`.
  let blankApp = null;
  const $ = (id) => document.getElementById(id);
  // Where the gateway is: "https://gw.example/" at a host's root, "https://intranet.example/
  // rag/" where a front proxy serves it under a path prefix. Taken from this script's own
  // address (<gateway>/console/console.js; the CSP lets only this origin's scripts run), not
  // from the page's path, which a proxy may spell otherwise ("//console", "/console/"), and
  // every call, redirect URI and return address is a URL resolved against it.
  const gateway = new URL("../", document.currentScript.src);
  const at = (path) => new URL(path.replace(/^\/+/, ""), gateway).href; // "/search" -> <gateway>search
  const here = at("console"); // the page's own address

  class Refused extends Error {}

  async function call(method, path, body) {
    const sent = token;
    const headers = { Authorization: `Bearer ${sent}` };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(at(path), {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body),
    });
    policyVersion = response.headers.get("Gateway-Policy-Version") || policyVersion;
    let data = null;
    try { data = await response.json(); } catch { data = null; }
    // Signed out (or in as someone else) while this call was under way: its answer belongs to
    // a session that is over, and must neither be shown nor sign the new one out.
    if (token !== sent) throw new Refused();
    if (response.status === 401) {
      signOut("Your token was refused: it has expired or is not valid. Sign in again, or paste a new one.");
      throw new Refused();
    }
    return { status: response.status, data };
  }

  function element(tag, text, className) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (className) node.className = className;
    return node;
  }

  function row(cells) {
    const tr = document.createElement("tr");
    for (const cell of cells) tr.append(cell instanceof Node ? cell : element("td", cell));
    return tr;
  }

  function definitions(list, pairs) {
    list.replaceChildren();
    for (const [term, value] of pairs) list.append(element("dt", term), element("dd", value ?? "—"));
  }

  function problem(data) {
    if (!data) return "The gateway did not answer as expected.";
    if (Array.isArray(data.errors) && data.errors.length) {
      // A 422 names each part of the request at fault and what is wrong with it.
      const lines = data.errors.map((e) => `${(e.loc || []).join(".")}: ${e.msg}`);
      return [data.detail || data.title, ...lines].join("\n");
    }
    return (data.problems || [data.detail || data.title]).join("\n");
  }

  // A JWT's payload is base64url of UTF-8 JSON: atob alone gives Latin-1 ("zoë" as "zoÃ«").
  function payloadOf(raw) {
    try {
      const part = raw.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
      const bytes = Uint8Array.from(atob(part), (c) => c.charCodeAt(0));
      const payload = JSON.parse(new TextDecoder().decode(bytes));
      return isPlainObject(payload) ? payload : {};
    } catch { return {}; }
  }

  // -- signing in and out ----------------------------------------------------------------

  // Every way the token is dropped (signing out, a refused or expired token, "Not an admin")
  // comes here, and leaves nothing of that session on the page for the next person at this
  // browser: not the token box, and not what the signed-in part showed or was typed into it.
  function signOut(message) {
    token = null;
    pending = null;
    policyVersion = "";
    claimNames = CONTRACT_CLAIMS;
    $("token").value = "";
    freshApp();
    $("app").hidden = true;
    $("sign-out").hidden = true;
    $("idp-sign-out").hidden = !atProvider;
    $("who").textContent = "";
    $("sign-in").hidden = false;
    $("sign-in-error").textContent = message || "";
  }

  async function signIn(event) {
    event.preventDefault();
    const pasted = $("token").value.trim();
    if (!pasted) { $("sign-in-error").textContent = "Paste a token first."; return; }
    $("token").value = ""; // kept in memory only, whatever the gateway answers
    await useToken(pasted);
  }

  async function useToken(given) {
    token = given;
    let answer;
    try { answer = await call("GET", "/admin/index"); } catch (error) {
      if (!(error instanceof Refused)) signOut("The gateway cannot be reached.");
      return;
    }
    // Only `forbidden` means "not an admin"; another 403 (insufficient_claims,
    // account_disabled) says what is wrong with the token itself.
    if (answer.status === 403 && answer.data && answer.data.code === "forbidden") {
      signOut("Not an admin: this token is not an admin of its tenant, so the console shows nothing.");
      return;
    }
    if (answer.status !== 200) {
      const code = answer.data && answer.data.code ? ` (${answer.data.code})` : "";
      signOut(`${problem(answer.data)}${code}`);
      return;
    }
    $("sign-in").hidden = true;
    $("app").hidden = false;
    $("sign-out").hidden = false;
    if (answer.data.claims) claimNames = answer.data.claims;
    const claims = payloadOf(token);
    const own = (name) => claims[claimNames[name]];
    $("who").textContent = `${own("subject") || "?"} · tenant ${own("tenant") || "?"}`;
    const sample = {
      [claimNames.subject]: "alice", [claimNames.tenant]: own("tenant") || "",
      [claimNames.region]: own("region") || "", [claimNames.groups]: [],
    };
    // A directory matched on a claim of its own (Entra's oid): a token of a tenant with a
    // directory must carry it, and its value is the person's there, which nothing here can
    // guess (a made-up one would explain some other user, or none, without saying so). Left
    // empty, explain says what to fill in until it is.
    if (claimNames.user && !(claimNames.user in sample)) sample[claimNames.user] = "";
    $("claims").value = JSON.stringify(sample, null, 2);
    showIndex(answer.data);
    show("try-as");
    await Promise.all([loadRecent(), loadPolicy()]).catch(() => {});
  }

  // -- signing in at the identity provider: authorization code with PKCE (S256) ---------
  // A public client: the page keeps no secret. The provider's pages open in a window of
  // their own; its answer comes back from /console/callback over a BroadcastChannel, so
  // this page (and the verifier in its memory) stays loaded throughout.

  function base64url(bytes) {
    return btoa(String.fromCharCode(...new Uint8Array(bytes)))
      .replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  }

  function randomText() {
    return base64url(crypto.getRandomValues(new Uint8Array(32)));
  }

  async function loadProvider() {
    const config = await (await fetch(at("console/sign-in.json"))).json();
    if (!config.issuer || !config.client_id) return;
    const response = await fetch(`${config.issuer.replace(/\/$/, "")}/.well-known/openid-configuration`);
    const discovery = await response.json();
    // OpenID Connect Discovery: the document must name the issuer the gateway trusts.
    if (!response.ok || discovery.issuer !== config.issuer) return;
    provider = { ...config, discovery };
    $("idp").hidden = false;
  }

  async function startProviderSignIn() {
    // Opened now, while the click still counts, or a popup blocker would stop it.
    const popup = window.open("", "gateway-sign-in", "popup,width=520,height=680");
    if (!popup) { $("sign-in-error").textContent = "Allow this page to open a window to sign in."; return; }
    try {
      const verifier = randomText();
      const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(verifier));
      pending = { state: randomText(), verifier, redirectUri: `${here}/callback` };
      popup.location.href = withQuery(new URL(provider.discovery.authorization_endpoint), {
        response_type: "code", client_id: provider.client_id, redirect_uri: pending.redirectUri,
        scope: provider.scope, state: pending.state,
        code_challenge: base64url(digest), code_challenge_method: "S256",
      });
    } catch (error) {
      popup.close();
      throw error;
    }
  }

  async function finishProviderSignIn(event) {
    const query = new URLSearchParams((event.data && event.data.query) || "");
    const asked = pending;
    // Only the answer to the request this page made (its state), from the issuer it trusts.
    if (!asked || query.get("state") !== asked.state) return;
    pending = null;
    atProvider = { idToken: null }; // whatever it answered, it may now hold a session
    if (query.has("iss") && query.get("iss") !== provider.issuer) {
      signOut("The sign-in answer came from another issuer."); return;
    }
    if (query.get("error")) { signOut(`Not signed in: ${query.get("error")}`); return; }
    const response = await fetch(provider.discovery.token_endpoint, {
      method: "POST",
      headers: { "Content-Type": "application/x-www-form-urlencoded" },
      body: new URLSearchParams({
        grant_type: "authorization_code", code: query.get("code") || "",
        redirect_uri: asked.redirectUri, client_id: provider.client_id, code_verifier: asked.verifier,
      }),
    });
    const data = await response.json().catch(() => ({}));
    if (!response.ok || !data.access_token) {
      signOut(`The identity provider gave no token: ${data.error || response.status}`); return;
    }
    atProvider = { idToken: typeof data.id_token === "string" ? data.id_token : null };
    await useToken(data.access_token);
  }

  // Signing out of a provider's sign-in ends the provider's session too (OpenID Connect
  // RP-Initiated Logout): otherwise the next "Sign in" at this browser would be let through
  // by that session, without a password, as whoever signed in last. The page goes to the
  // provider, which may ask to confirm, and is sent back to /console. By GET: a cross-site
  // POST would not carry a provider's SameSite=Lax session cookie (oidc-provider's, for
  // one), so the provider could not tell which session to end.
  function leave() {
    const session = atProvider;
    atProvider = null;
    const ending = session && endSessionUrl(session);
    if (!ending) {
      signOut(session
        ? "Signed out here. Your identity provider offers no sign-out this page can use, so its session goes on: on a shared machine, sign out there too."
        : "Signed out.");
      return;
    }
    signOut("Signing out at your identity provider…");
    window.location.assign(ending);
  }

  function endSessionUrl(session) {
    let url;
    try { url = new URL(provider.discovery.end_session_endpoint); } catch { return null; }
    if (url.protocol !== "https:") return null; // as the specification requires
    const fields = { client_id: provider.client_id, post_logout_redirect_uri: here };
    if (session.idToken) fields.id_token_hint = session.idToken;
    return withQuery(url, fields);
  }

  // A provider's endpoint with `fields` added to, not replacing, a query it may already have
  // (Azure AD B2C's `p=`).
  function withQuery(url, fields) {
    for (const [name, value] of Object.entries(fields)) url.searchParams.set(name, value);
    return url.toString();
  }

  function show(panel) {
    for (const section of document.querySelectorAll(".panel")) section.hidden = section.id !== panel;
    for (const tab of document.querySelectorAll(".tab")) {
      tab.classList.toggle("active", tab.dataset.panel === panel);
    }
  }

  // -- Try as ------------------------------------------------------------------------------

  async function loadRecent() {
    const { status, data } = await call("GET", "/admin/audit?limit=200");
    if (status !== 200) return;
    const select = $("recent");
    const subjects = [...new Set(data.records.map((r) => r.subject))].sort();
    select.replaceChildren(element("option", "—"));
    select.firstChild.value = "";
    for (const subject of subjects) {
      const option = element("option", subject);
      option.value = subject;
      select.append(option);
    }
  }

  function pickRecent() {
    const subject = $("recent").value;
    if (!subject) return;
    let claims = {};
    try { claims = JSON.parse($("claims").value); } catch { claims = {}; }
    if (!isPlainObject(claims)) claims = {};
    claims[claimNames.subject] = subject;
    $("claims").value = JSON.stringify(claims, null, 2);
  }

  const REASONS = {
    acl: "none of their principals is on the ACL",
    region: "their readable regions do not include the document's",
    tenant: "another tenant's document",
    effective_from: "not in force yet on that day",
    effective_to: "no longer in force on that day",
    no_principals: "they hold no principal",
    // Explain says why in its `detail`, shown instead of these.
    insufficient_claims: "a token with these claims is refused",
    account_disabled: "the directory has disabled or deleted this account",
  };

  function isPlainObject(value) {
    return typeof value === "object" && value !== null && !Array.isArray(value);
  }

  function why(explained) {
    if (explained.visible) {
      // The version explain decided on (the newest visible, as GET /documents serves), not
      // the first visible one listed: several can be in force at once.
      const version = explained.versions.find((v) => v.version === explained.version)
        || { matched_principals: [], granted_by: {} };
      const matched = version.matched_principals.map((p) => `${p} (${version.granted_by[p] || "?"})`);
      return `acl: ${matched.join(", ")}`;
    }
    return `${explained.rule}: ${explained.detail || REASONS[explained.rule] || ""}`;
  }

  async function tryAs(event) {
    event.preventDefault();
    $("try-error").textContent = "";
    let claims;
    try { claims = JSON.parse($("claims").value); } catch { claims = null; }
    if (!isPlainObject(claims)) { // not [], null or "alice": explain takes a token's claims
      $("try-error").textContent = "The claims must be a JSON object, such as {\"sub\": \"alice\", …}."; return;
    }
    const query = $("query").value.trim();
    if (!query) { $("try-error").textContent = "Type a query first."; return; }
    const searched = await call("POST", "/search", { query, top_k: 10 });
    if (searched.status !== 200) { $("try-error").textContent = problem(searched.data); return; }
    const body = $("results").querySelector("tbody");
    body.replaceChildren();
    const seen = new Set();
    for (const result of searched.data.results) {
      if (seen.has(result.doc_id)) continue;
      seen.add(result.doc_id);
      const explained = await call("POST", "/admin/explain", { subject: claims, doc_id: result.doc_id });
      if (explained.status !== 200) { $("try-error").textContent = problem(explained.data); return; }
      const verdict = explained.data.visible
        ? element("td", "visible", "visible-doc") : element("td", "hidden", "hidden-doc");
      const tr = row([result.doc_id, result.title, result.score.toFixed(4), verdict, why(explained.data)]);
      tr.dataset.doc = result.doc_id;
      body.append(tr);
    }
    $("results").hidden = false;
    if (!searched.data.results.length) $("try-error").textContent = "Nothing found for you.";
    timings(searched.data.timings_ms || {});
  }

  function timings(stages) {
    const bars = $("timings");
    bars.replaceChildren();
    const entries = Object.entries(stages).filter(([, ms]) => typeof ms === "number");
    const longest = Math.max(1e-3, ...entries.map(([, ms]) => ms));
    for (const [stage, ms] of entries) {
      const bar = element("div", null, "bar");
      bar.style.width = `${(100 * ms) / longest}%`;
      const track = element("div");
      track.append(bar);
      bars.append(element("span", stage), track, element("span", ms.toFixed(2)));
    }
    $("timings-title").hidden = entries.length === 0;
  }

  // -- Policy ------------------------------------------------------------------------------

  async function loadPolicy() {
    const { status, data } = await call("GET", "/admin/policy");
    if (status === 200) {
      const last = data.last_reload;
      definitions($("policy-state"), [
        ["Version", data.version], ["Files", data.files.join(", ")],
        ["Directory", data.directory], ["Loaded", data.loaded_at],
        ["Last reload", last ? `${last.outcome} at ${last.at}${last.problems ? `: ${last.problems}` : ""}` : "none"],
      ]);
      $("policy-note").textContent = "";
    } else {
      definitions($("policy-state"), [["Version", policyVersion]]);
      $("policy-note").textContent = "The files and the reload status are shown to the deployment's operators.";
    }
  }

  function addFile(name) {
    const box = element("div", null, "file");
    const label = element("input");
    label.className = "file-name";
    label.value = name || "";
    label.placeholder = "policy.yaml";
    const text = element("textarea");
    text.className = "file-text";
    text.rows = 10;
    text.spellcheck = false;
    box.append(label, text);
    $("files").append(box);
  }

  async function preview() {
    const files = {};
    for (const box of $("files").querySelectorAll(".file")) {
      const name = box.querySelector(".file-name").value.trim();
      if (name) files[name] = box.querySelector(".file-text").value;
    }
    const out = $("preview-out");
    out.replaceChildren();
    const request = { files };
    if ($("as-of").value) request.as_of = $("as-of").value;
    const { status, data } = await call("POST", "/admin/policy/preview", request);
    if (status !== 200) {
      out.append(element("p", `Not previewed:\n${problem(data)}`, "error"));
      return;
    }
    out.append(element("p", data.widens
      ? `Widens: ${data.gained} version(s) gained by some caller, ${data.lost} lost`
      : `Does not widen: ${data.lost} version(s) lost by some caller`,
      `banner ${data.widens ? "widens" : "safe"}`));
    out.append(element("p",
      `Policy ${data.base_version} → ${data.new_version}, as of ${data.as_of}; ` +
      `${data.covers.documents} version(s) in force, ${data.covers.groups} group(s), ` +
      `${data.covers.users} user(s), regions ${data.covers.regions.join(", ")}.`, "muted"));
    const table = element("table");
    table.id = "changes";
    const head = element("thead");
    head.append(row(["Callers in", "Holding", "Gain", "Lose"].map((t) => element("th", t))));
    const body = element("tbody");
    for (const change of data.changes) {
      const holding = [...change.groups.map((g) => `group:${g}`), ...change.users.map((u) => `user:${u}`)];
      body.append(row([change.regions.join(", "), holding.join(", "),
        change.gains.join(", "), change.losses.join(", ")]));
    }
    table.append(head, body);
    out.append(table);
  }

  // -- Index -------------------------------------------------------------------------------

  function showIndex(data) {
    definitions($("index-state"), [
      ["Generation served", data.index_generation], ["Committed", data.generation_created_at],
      ["Documents", data.documents], ["Versions", data.versions], ["Chunks", data.chunks],
    ]);
    const body = $("jobs").querySelector("tbody");
    body.replaceChildren();
    for (const job of data.jobs) {
      body.append(row([job.job_id, job.status, job.documents, job.chunks, job.created_at, job.finished_at || "—"]));
    }
    if (!data.jobs.length) body.append(row(["no ingest jobs yet", "", "", "", "", ""]));
  }

  async function refreshIndex() {
    const { status, data } = await call("GET", "/admin/index");
    if (status === 200) showIndex(data);
  }

  // -- wiring ------------------------------------------------------------------------------

  function guarded(handler) {
    return (event) => handler(event).catch((error) => {
      if (!(error instanceof Refused)) $("try-error").textContent = String(error);
    });
  }

  // Signing out puts a copy of #app as it loaded in place of the one shown, so that nothing
  // an admin saw or typed (results, query, claims, timings, recent subjects, a preview, the
  // file editors, the policy and index pages) is left for the next admin, whatever panel
  // comes later. A reload would do that too, but would forget the provider's session this
  // page must still offer to end (`atProvider`), and browsers may restore a reloaded
  // page's form fields.
  function freshApp() {
    $("app").replaceWith(blankApp.cloneNode(true));
    wireApp();
  }

  function wireApp() {
    $("try-form").addEventListener("submit", guarded(tryAs));
    $("recent").addEventListener("change", pickRecent);
    $("add-file").addEventListener("click", () => addFile(""));
    $("preview").addEventListener("click", guarded(preview));
    for (const tab of document.querySelectorAll(".tab")) {
      tab.addEventListener("click", guarded(async () => {
        show(tab.dataset.panel);
        if (tab.dataset.panel === "index") await refreshIndex();
        if (tab.dataset.panel === "policy") await loadPolicy();
      }));
    }
    addFile("policy.yaml");
  }

  document.addEventListener("DOMContentLoaded", () => {
    blankApp = $("app").cloneNode(true);
    wireApp();
    $("sign-in-form").addEventListener("submit", guarded(signIn));
    $("idp-sign-in").addEventListener("click", () => startProviderSignIn().catch(
      () => { $("sign-in-error").textContent = "The identity provider cannot be reached."; }));
    const channel = new BroadcastChannel("gateway-console-sign-in");
    channel.addEventListener("message", (event) => finishProviderSignIn(event).catch(
      () => signOut("The identity provider cannot be reached.")));
    loadProvider().catch(() => {});
    $("sign-out").addEventListener("click", leave);
    $("idp-sign-out").addEventListener("click", leave);
  });
})();
