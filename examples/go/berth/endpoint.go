package berth

import (
	"fmt"
	"os"
	"regexp"
	"strings"
)

// The addresses the services listen on unless configured otherwise.
const (
	DefaultSessionsURL = "http://127.0.0.1:7301"
	DefaultBudgetURL   = "http://127.0.0.1:7302"
)

// Service names one of berth's two services.
type Service string

const (
	Sessions Service = "sessions"
	Budget   Service = "budget"
)

func (s Service) defaultURL() string {
	if s == Budget {
		return DefaultBudgetURL
	}
	return DefaultSessionsURL
}

// env is the prefix of the service's variables: BERTH_SESSIONS_, BERTH_BUDGET_.
func (s Service) env() string { return "BERTH_" + strings.ToUpper(string(s)) + "_" }

// Getenv reads a variable; os.Getenv unless a test or a caller passes another.
type Getenv func(name string) string

// given: a setting counts when it has more than blanks, as the berth command reads it.
func given(value string) bool { return strings.TrimSpace(value) != "" }

func first(values ...string) string {
	for _, v := range values {
		if given(v) {
			return v
		}
	}
	return ""
}

var (
	httpURL = regexp.MustCompile(`^https?://[^/]+`)
	unixURL = regexp.MustCompile(`^unix:.+`)
)

// ResolveURL says where service is, the way the berth command finds it: explicit if not blank, else
// BERTH_<SERVICE>_URL, else unix:$BERTH_<SERVICE>_SOCKET, else BERTH_HOST (0.0.0.0 and :: meaning
// 127.0.0.1) with BERTH_<SERVICE>_PORT (either alone takes the other's default), else
// http://127.0.0.1:7301 (sessions) or :7302 (budget). Trailing slashes are dropped. A URL that is
// neither http(s)://HOST… nor unix:PATH is an error.
func ResolveURL(service Service, explicit string, getenv Getenv) (string, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	urlEnv := service.env() + "URL"
	url := first(explicit, getenv(urlEnv), serverSettingsURL(service, getenv), service.defaultURL())
	if !httpURL.MatchString(url) && !unixURL.MatchString(url) {
		from := urlEnv
		if explicit != "" {
			from = "the URL"
		}
		return "", fmt.Errorf("%s must look like http://127.0.0.1:7301 or unix:/path/to/socket, got %q", from, url)
	}
	return strings.TrimRight(url, "/"), nil
}

// serverSettingsURL is the URL the service itself would listen on, from the variables that
// configure it: an environment set up for `berth up` (a shell, a compose file, an env file) then
// works for clients too. "" when none of them is set.
func serverSettingsURL(service Service, getenv Getenv) string {
	if socket := getenv(service.env() + "SOCKET"); given(socket) {
		return "unix:" + socket
	}
	port, host := getenv(service.env()+"PORT"), getenv("BERTH_HOST")
	if !given(port) && !given(host) {
		return ""
	}
	switch {
	case !given(host) || host == "0.0.0.0" || host == "::":
		// A service listening on every address is reached on loopback.
		host = "127.0.0.1"
	case strings.Contains(host, ":"):
		host = "[" + host + "]"
	}
	if !given(port) {
		port = service.defaultURL()[strings.LastIndex(service.defaultURL(), ":")+1:]
	}
	return "http://" + host + ":" + port
}

// ResolveToken is the bearer token: token if not blank, else the contents of tokenFile, else of
// BERTH_TOKEN_FILE, else BERTH_TOKEN; "" without one. A token file that cannot be read, or is
// empty, is an error.
func ResolveToken(token, tokenFile string, getenv Getenv) (string, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	if given(token) {
		return token, nil
	}
	if path := first(tokenFile, getenv("BERTH_TOKEN_FILE")); path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return "", fmt.Errorf("cannot read the token file %s: %w", path, err)
		}
		value := strings.TrimSpace(string(data))
		if value == "" {
			return "", fmt.Errorf("the token file %s is empty", path)
		}
		return value, nil
	}
	return first(getenv("BERTH_TOKEN")), nil
}
