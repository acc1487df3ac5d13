// The OpenID provider the tests sign in with: npm `oidc-provider` (a certified
// implementation), served over TLS on loopback by tests/helpers/idp.py, which passes:
//   IDP_PORT, IDP_CERT, IDP_KEY          where to listen, the certificate the test's CA signed
//   IDP_SIGNING_KEY, IDP_COOKIE_KEY      the tokens' RSA key (PEM file) and the cookies' key
//   IDP_CONSOLE_REDIRECT_URIS            the console's redirect URIs (space-separated); each
//                                        without its /callback is where signing out returns
//   IDP_CONSOLE_RESOURCE                 the gateway's audience, the console's tokens' `aud`
// Users carry the claims the gateway's policy reads (tenant, region, groups). The login and
// consent pages are the provider's own (devInteractions): any password is accepted.
import crypto from 'node:crypto';
import fs from 'node:fs';
import https from 'node:https';
import Provider from 'oidc-provider';

// Each stage says when it ended (seconds since node started), so that a start too slow for
// tests/helpers/idp.py shows in its failure where the time went.
const stage = (name) => console.log(`${name} at ${process.uptime().toFixed(2)} s`);
stage('modules loaded');

const port = Number(process.env.IDP_PORT);
const issuer = `https://127.0.0.1:${port}`;

const USERS = { // as tests/helpers/callers.py: root is an admin of acme through `ops`
  root: { name: 'Root Admin', tenant: 'acme', region: 'EU', groups: ['ops', 'staff', 'merchant-risk'] },
  alice: { name: 'Alice', tenant: 'acme', region: 'EU', groups: ['staff'] },
  bob: { name: 'Bob', tenant: 'acme', region: 'EU', groups: ['staff', 'merchant-risk'] },
};
// Client credentials (a service): the tests ask it for tokens bound to other resources.
const SERVICE = { tenant: 'acme', region: 'EU', groups: ['staff'] };

// Made by the test, not here: on CI a start twice stopped for minutes right at this point
// when node generated the key itself (see tests/helpers/idp.py).
const signing = crypto.createPrivateKey(fs.readFileSync(process.env.IDP_SIGNING_KEY));
const jwk = { ...signing.export({ format: 'jwk' }), kid: 'idp-rsa-1', alg: 'RS256', use: 'sig' };
stage('signing key read');

function gatewayClaims(accountId) {
  const user = USERS[accountId];
  return user ? { tenant: user.tenant, region: user.region, groups: user.groups } : SERVICE;
}

const consoleRedirects = (process.env.IDP_CONSOLE_REDIRECT_URIS || 'https://unused.test/').split(' ');

const provider = new Provider(issuer, {
  jwks: { keys: [jwk] },
  cookies: { keys: [process.env.IDP_COOKIE_KEY] },
  clients: [
    {
      client_id: 'gateway-console', // a public client: a browser page keeps no secret
      token_endpoint_auth_method: 'none',
      redirect_uris: consoleRedirects,
      // Signing out comes back to the console's page (RP-initiated logout).
      post_logout_redirect_uris: consoleRedirects.map((uri) => uri.replace(/\/callback$/, '')),
      grant_types: ['authorization_code'],
      response_types: ['code'],
    },
    {
      client_id: 'svc',
      client_secret: 'svc-secret',
      grant_types: ['client_credentials'],
      redirect_uris: [],
      response_types: [],
    },
  ],
  claims: { openid: ['sub'], profile: ['name'] },
  scopes: ['openid', 'offline_access', 'search'], // search: the gateway's MCP scope
  async findAccount(_ctx, id) {
    if (!USERS[id]) return undefined;
    return { accountId: id, async claims() { return { sub: id, name: USERS[id].name }; } };
  },
  // The gateway reads tenant, region and groups from the access token it is sent.
  async extraTokenClaims(_ctx, token) {
    return gatewayClaims(token.accountId);
  },
  clientBasedCORS(_ctx, origin, client) {
    return client.clientAuthMethod === 'none'
      && client.redirectUris.some((uri) => URL.parse(uri)?.origin === origin);
  },
  pkce: { required: () => true },
  features: {
    devInteractions: { enabled: true },
    clientCredentials: { enabled: true },
    registration: { enabled: true }, // dynamic client registration, as MCP clients do it
    rpInitiatedLogout: { enabled: true },
    resourceIndicators: {
      enabled: true,
      // The console names no resource: its tokens are for the gateway's audience.
      defaultResource: (_ctx, client, oneOf) => oneOf
        || (client.clientId === 'gateway-console' ? process.env.IDP_CONSOLE_RESOURCE : undefined),
      useGrantedResource: () => true,
      // Any resource: a JWT whose `aud` is that resource and whose scope can hold `search`.
      getResourceServerInfo: (_ctx, resource) => ({
        scope: 'search',
        audience: resource,
        accessTokenFormat: 'jwt',
        accessTokenTTL: 600,
        jwt: { sign: { alg: 'RS256' } },
      }),
    },
  },
  ttl: {
    AccessToken: 600, ClientCredentials: 600, IdToken: 600, Interaction: 600,
    Session: 3600, Grant: 3600, AuthorizationCode: 60,
  },
});

for (const event of ['server_error', 'authorization.error', 'grant.error', 'registration_create.error']) {
  provider.on(event, (_ctx, error) => console.error(event, error));
}

const server = https.createServer(
  { key: fs.readFileSync(process.env.IDP_KEY), cert: fs.readFileSync(process.env.IDP_CERT) },
  provider.callback(),
);
server.listen(port, '127.0.0.1', () => stage(`listening on ${issuer}`));
process.on('SIGTERM', () => server.close(() => process.exit(0)));
