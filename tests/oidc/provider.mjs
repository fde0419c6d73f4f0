// A real OpenID Connect provider for the tests: panva's oidc-provider (npm, installed into build/npm by .ci/run),
// configured with one confidential client and the test accounts given on the command line.
//
//   node tests/oidc/provider.mjs PORT CONFIG_JSON
//   CONFIG_JSON: {"client_id", "client_secret", "redirect_uris": [...], "accounts": {"<login>": {"email", "groups": [...]}}}
//   OIDC_PROVIDER_MODULE: the file of oidc-provider's entry point (ES modules resolve packages beside the script, not build/npm).
//
// Sign-in is the library's own development interaction: a login form (the account's login; any password)
// and a consent page. Codes need PKCE (S256). It prints "listening <issuer>" once it answers.
import { pathToFileURL } from "node:url";

const [port, configText] = process.argv.slice(2);
const config = JSON.parse(configText);
const { default: Provider } = await import(pathToFileURL(process.env.OIDC_PROVIDER_MODULE).href);
const issuer = `http://127.0.0.1:${port}`;

const provider = new Provider(issuer, {
  clients: [{
    client_id: config.client_id,
    client_secret: config.client_secret,
    redirect_uris: config.redirect_uris,
    grant_types: ["authorization_code"],
    response_types: ["code"],
    token_endpoint_auth_method: "client_secret_basic",
  }],
  pkce: { required: () => true },
  scopes: ["openid", "email", "profile", "groups"],
  claims: { openid: ["sub"], email: ["email", "email_verified"], profile: ["name"], groups: ["groups"] },
  conformIdTokenClaims: false, // the claims asked for by scope go into the ID token too (the relying party reads them there)
  features: { devInteractions: { enabled: true } },
  async findAccount(ctx, id) {
    const account = config.accounts[id];
    if (!account) return undefined;
    return {
      accountId: id,
      async claims() {
        return { sub: id, email: account.email, email_verified: true, name: id, groups: account.groups || [] };
      },
    };
  },
});
provider.listen(Number(port), "127.0.0.1", () => console.log(`listening ${issuer}`));
