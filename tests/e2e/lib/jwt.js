'use strict';
// HS256 JSON Web Tokens minted with node:crypto (RFC 7519 / RFC 7515 compact form).

const crypto = require('node:crypto');

function b64url(data) {
  return Buffer.from(data).toString('base64url');
}

/**
 * A compact JWS over `claims`. `alg` is written into the header as given; the signature
 * is HMAC-SHA256 with `secret` for "HS256", HMAC-SHA512 for "HS512", and empty for
 * "none" (an unsigned token, which the server must refuse).
 */
function sign(claims, secret, { alg = 'HS256', typ = 'JWT' } = {}) {
  const header = typ === null ? { alg } : { alg, typ };
  const input = `${b64url(JSON.stringify(header))}.${b64url(JSON.stringify(claims))}`;
  let signature = '';
  if (alg === 'HS256') signature = crypto.createHmac('sha256', secret).update(input).digest('base64url');
  else if (alg === 'HS512') signature = crypto.createHmac('sha512', secret).update(input).digest('base64url');
  else if (alg !== 'none') throw new Error(`jwt.sign: cannot sign with ${alg}`);
  return `${input}.${signature}`;
}

/**
 * A token for participant `sub` in namespace `ns`, valid for an hour unless `exp` is
 * given (seconds since the epoch). `grants` is the `amp` claim (omitted when undefined).
 */
function token(secret, { sub, ns, grants, exp, nbf, extra = {}, alg = 'HS256' }) {
  const now = Math.floor(Date.now() / 1000);
  const claims = { sub, ns, iat: now, exp: exp ?? now + 3600, ...extra };
  if (nbf !== undefined) claims.nbf = nbf;
  if (grants !== undefined) claims.amp = grants;
  return sign(claims, secret, { alg });
}

module.exports = { sign, token };
